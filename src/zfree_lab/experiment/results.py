"""A sweep or study folder, loaded: the tidy tables (``zfree report`` writes them), the failures,
the z-free reference the runs used, and theory's predictions for the same rows. This is what
the notebooks and ``zfree_lab.report.widgets`` read; ``zfree_lab.experiment.sweeps`` writes the run folders it reads.
The bottom of the experiment layer: sweeps and study build on it, nothing here points back up.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from zfree.core.io import atomic_write_text, read_json, read_jsonl, read_table
from zfree.core.paths import PATH_FIELDS, ROOT, resolve_path
from zfree.data.pairs import load_pairs
from zfree.evaluate.latent_stats import label_warnings
from zfree.objective.theory import predict_curve
from zfree.reference.records import MATCH_KEYS as PREFIX_MATCH_KEYS, PREFIX_REFERENCE_DIR
from zfree_lab.run.run_config import resolved_flat
from zfree_lab.experiment.controls import LINKS_FILE
from zfree_lab.experiment.gains import GAIN_COLUMNS, oracle_table, run_gains
from zfree_lab.experiment.run_summary import read_run_summary
from zfree_lab.experiment.study_folders import check_folder, given_kind
from zfree_lab.experiment.study_notes import study_notes

FACETS = ("weighting", "latent_kind", "aid")  # what tells runs of one sweep apart, besides beta

SUMMARY_COLUMNS = {  # summary.csv column -> key in a run's summary.json
    "run_id": "run_id", "weighting": "weighting", "beta": "beta", "aid": "aid",
    "recon_weight": "objective/recon_weight_mean",
    "kl_prior_loss": "loss/val/kl_prior_loss",
    "baseline_normalized_reconstruction_loss": "loss/val/baseline_normalized_reconstruction_loss",
    "reconstruction_loss": "loss/val/reconstruction_loss",
    "oracle_rho": "latent/oracle_rho", "codes_used": "latent/codes_used", "q_max_mean": "latent/q_max_mean",
    "alignment_nmi": "structure/alignment_nmi", "alignment_nmi_unambiguous": "structure/alignment_nmi_unambiguous",
    "probe_accuracy": "structure/probe_accuracy", "probe_accuracy_init": "init/structure/probe_accuracy",
    "z_control_accuracy": "structure/z_control_accuracy",
    "task_correctness": "task/correctness", "base_task_correctness": "init/task/correctness",
    "decoder_jsd": "latent/decoder_jsd", "beta_eff_median": "objective/beta_eff_median",
    "predicted_use_fraction": "latent/predicted_use_fraction",
    "measured_use_fraction": "latent/measured_use_fraction",
    "predicted_latent_used": "predicted_latent_used", "latent_used": "latent_used",
    "c_base": "reference/c_base", "steps": "steps", "wall_s": "wall_s",
    "latent_kind": "latent_kind", "n_latent": "n_latent", "posterior_features": "posterior_features",
    "hungarian_accuracy_unambiguous": "structure/hungarian_accuracy_unambiguous",
    "mutual_information": "latent/mutual_information",
    "gate_first_pass_step": "aid/gate_first_pass_step", "handover_step": "aid/handover_step",
    "handover_forced": "aid/handover_forced", "seed": "seed", "lr_new": "lr_new",
    # the remedies leaderboard: the remedy entry, and the training compute in token
    # positions forwarded through the decoder body (inner and extra passes included) and its wall time
    "remedy": "remedy", "forward_tokens": "compute/forward_tokens", "train_wall_s": "compute/train_wall_s",
    "aggressive_end_step": "aid/aggressive_end_step", "aggressive_inner_steps": "aid/aggressive_inner_steps",
}


#: collect_runs' selections: the CVAE runs (the default: every table, figure and verdict), the
#: given-z runs (the z-free controls and label oracles, ``zfree_lab.experiment.controls``), or all
RUN_KINDS = ("cvae", "given", "all")


def collect_runs(runs_dir: Path | str, kind: str = "cvae") -> pd.DataFrame:
    """One row per finished run folder of ``kind`` (``RUN_KINDS``; its ``summary.json``,
    data_dir/base_dir resolved to absolute paths: ``zfree.core.paths.resolve_path``), plus
    ``run_id`` and ``run_dir``. ValueError listing the kinds for another ``kind``."""
    if kind not in RUN_KINDS:
        raise ValueError(f"kind={kind!r} is not one of {list(RUN_KINDS)}")
    check_folder(Path(runs_dir).parent)
    rows = []
    for s in sorted(Path(runs_dir).glob("*/summary.json")):
        d = read_run_summary(s)
        given = given_kind(d) is not None
        if (kind == "cvae" and given) or (kind == "given" and not given):
            continue
        d = resolved_flat(d, s.parent)  # stored relative to the run folder (or zfree:...): absolute here
        d["run_id"], d["run_dir"] = s.parent.name, str(s.parent)
        rows.append(d)
    return pd.DataFrame(rows)


def summary_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The study's summary.csv: one row per finished CVAE run (columns: ``SUMMARY_COLUMNS``)."""
    if runs.empty:
        return pd.DataFrame(columns=list(SUMMARY_COLUMNS))
    runs = runs.copy()
    if "aid" not in runs:
        runs["aid"] = "none"
    cols = {c: runs[k] if k in runs else None for c, k in SUMMARY_COLUMNS.items()}
    return pd.DataFrame(cols).sort_values(["weighting", "beta", "run_id"]).reset_index(drop=True)


def summary_with_labels(runs: pd.DataFrame, notes: list[str]) -> pd.DataFrame:
    """summary.csv of a study on labelled data (own data, E2E): ``summary_table`` plus every
    ``structure/<metric>/<label>`` column of ``runs`` and a ``notes`` column (the study's notes,
    joined by " | ")."""
    tab = summary_table(runs)
    if not runs.empty:
        by_id = runs.set_index("run_id").loc[tab["run_id"]] if "run_id" in tab else runs
        for c in sorted(c for c in by_id.columns if c.startswith("structure/") and c.count("/") >= 2):  # keys may hold "/"
            tab[c] = by_id[c].to_numpy()
    tab["notes"] = " | ".join(notes)
    return tab


def study_summary(study_dir: Path | str) -> pd.DataFrame:
    """The summary.csv table of a study or sweep folder: ``summary_with_labels`` when the folder
    has a ``notes.json`` (a labelled-data study), else ``summary_table``; with the z-free control's
    gain columns (``zfree_lab.experiment.gains.GAIN_COLUMNS``) where the study trained controls."""
    d = Path(study_dir)
    runs = collect_runs(d / "runs")
    if (d / "notes.json").exists():  # the study's notes, then the label warnings of its (shared) evaluated rows
        notes = [*study_notes(d).get("notes", []), *label_warnings(runs.iloc[0] if len(runs) else {})]
        tab = summary_with_labels(runs, notes)
    else:
        tab = summary_table(runs)
    return with_gains(tab, d, runs)


def with_gains(tab: pd.DataFrame, study_dir: Path, runs: pd.DataFrame) -> pd.DataFrame:
    """``tab`` (one row per run_id) joined with ``run_gains`` when the study has controls; also
    writes ``available_gain.csv`` (the oracle table) and ``gains.csv`` beside it."""
    if tab.empty or not (study_dir / LINKS_FILE).exists():
        return tab
    oracles = oracle_table(study_dir)
    gains = run_gains(study_dir, runs, oracles)
    atomic_write_text(study_dir / "available_gain.csv", oracles.to_csv(index=False))
    atomic_write_text(study_dir / "gains.csv", gains.to_csv(index=False))
    keep = ["run_id", "control_run_id", *[c for c in GAIN_COLUMNS if c in gains]]
    return tab.merge(gains[keep], on="run_id", how="left")


def runs_table(sweep_dir: Path | str) -> pd.DataFrame:
    """The tidy table of a sweep: one row per finished run with every key of its summary.json,
    the short names of ``SUMMARY_COLUMNS``, and from its per-example table
    ``rate`` (mean KL, nats per sequence), ``distortion`` (mean |S|·ℓ̄, nats per sequence),
    ``zfree_distortion`` (mean |S|·b), ``bayes_rate`` (mean log(K/m)) and ``mean_rho_i``."""
    runs = collect_runs(Path(sweep_dir) / "runs")
    if runs.empty:
        return pd.DataFrame(columns=list(dict.fromkeys([*SUMMARY_COLUMNS, "latent_kind", "rate", "distortion"])))
    for short, key in SUMMARY_COLUMNS.items():
        if short not in runs:
            runs[short] = runs[key] if key in runs else np.nan
    runs["aid"] = runs["aid"].fillna("none")
    runs["latent_kind"] = runs["latent_kind"].fillna("discrete") if "latent_kind" in runs else "discrete"
    extra = []
    for d in runs["run_dir"]:
        f = Path(d) / "per_example.parquet"
        pe = pd.read_parquet(f) if f.exists() else pd.DataFrame()
        col = lambda c: pe[c].to_numpy(float) if c in pe else np.full(len(pe), np.nan)  # noqa: E731
        means = {"rate": col("kl"), "distortion": col("n_tokens") * col("lbar"),
                 "zfree_distortion": col("n_tokens") * col("b"), "bayes_rate": col("bayes_nll"),
                 "mean_rho_i": col("rho_i")}
        extra.append({k: float(np.mean(v)) if len(pe) else np.nan for k, v in means.items()})
    runs = pd.concat([runs, pd.DataFrame(extra, index=runs.index)], axis=1)
    return runs.sort_values([*FACETS, "beta", "run_id"]).reset_index(drop=True)


def per_example_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Every run's per_example.parquet stacked, tagged with run_id, beta, recon_weight and the facets."""
    tags = ["run_id", "beta", "recon_weight", "seed", *FACETS]
    parts = []
    for _, r in runs.iterrows():
        f = Path(r["run_dir"]) / "per_example.parquet"
        if f.exists():
            pe = pd.read_parquet(f)
            parts.append(pe.assign(**{t: r[t] for t in tags if t in r}))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=tags)


@dataclass
class SweepResults:
    """A finished (or running) sweep or study folder, loaded for the notebooks and widgets."""

    sweep_dir: Path
    runs: pd.DataFrame  # runs_table
    errors: list[dict]  # error.json of failed points
    reference: dict | None  # the base run's reference.json
    examples: pd.DataFrame | None  # validation rows: id, n_tokens, b, bayes_nll
    _per_example: pd.DataFrame | None = None

    @property
    def per_example(self) -> pd.DataFrame:
        """Every run's per-example table stacked (``per_example_table``), read once."""
        if self._per_example is None:
            self._per_example = per_example_table(self.runs)
        return self._per_example

    def metrics(self, run_id: str) -> pd.DataFrame:
        """The metrics.jsonl rows of one run, one row per evaluation."""
        return pd.DataFrame(read_jsonl(self.sweep_dir / "runs" / run_id / "metrics.jsonl"))

    def config(self, run_id: str) -> dict:
        """The flat TrainConfig of a run (its config.json without the "_" metadata keys), its paths
        (``PATH_FIELDS``) absolute: config.json stores them relative to the run folder or as
        ``zfree:<path>`` (docs/reference/artifacts.md), which means nothing to a run launched from it in
        another folder (the launch panel's template)."""
        run_dir = self.sweep_dir / "runs" / run_id
        flat = {k: v for k, v in read_json(run_dir / "config.json").items() if not k.startswith("_")}
        return {k: resolve_path(v, run_dir) if k in PATH_FIELDS and isinstance(v, str) and v else v
                for k, v in flat.items()}

    def label(self, row: pd.Series, with_beta: bool = True) -> str:
        """``weighting[, latent_kind][, aid], β=…``, naming a facet only where the sweep varies it; the
        names joined by ", " as the report's ``run_label`` joins them ("distribution, hard_em_then_soft,
        β=0.3"), so a curve's legend reads as the same run's row in the tables."""
        parts = [str(row[f]) for f in FACETS if f in self.runs and self.runs[f].nunique() > 1 or f == "weighting"]
        return ", ".join(parts + ([f"β={row['beta']:g}"] if with_beta else []))

    def theory_curves(self, betas: np.ndarray | None = None, with_excess: bool = True) -> pd.DataFrame | None:
        """``zfree.objective.theory.predict_curve`` for every weighting in the sweep (token weighting
        predicted as its outer weighting), counting the base model's excess over the Bayes loss
        (``excess_seq`` = |S|·b − bayes_nll) unless ``with_excess=False``, as the per-example
        ``predicted_use`` column does; None without a reference or Bayes losses."""
        ex = self.examples
        if self.reference is None or ex is None or ex["bayes_nll"].isna().any() or self.runs.empty:
            return None
        if betas is None:
            betas = np.geomspace(min(self.runs["beta"].min(), 1e-3) / 2, max(self.runs["beta"].max(), 1.0) * 2, 80)
        out = []
        for w in self.runs["weighting"].unique():
            s = self.runs[self.runs["weighting"] == w]
            outer = {"none": "plain"}.get(str(s["token_outer"].iloc[0]), str(s["token_outer"].iloc[0])) \
                if w == "token" and "token_outer" in s else w
            eps = float(s["epsilon"].iloc[0]) if "epsilon" in s else 0.0
            n_tok, bn, b = (np.array(ex[c], float) for c in ("n_tokens", "bayes_nll", "b"))
            c = predict_curve(outer, betas, n_tok, bn, b=b, c_base=self.reference["c_base"], epsilon=eps,
                              excess_seq=n_tok * b - bn if with_excess else None)
            out.append(c.assign(weighting=w))
        return pd.concat(out, ignore_index=True)

    def critical_betas(self) -> dict[str, float]:
        """Per weighting: the beta where the predicted use fraction crosses 1/2 (geometric
        interpolation on the theory grid). For a scalar weight w (plain, distribution) it is
        ``critical_beta_over_w * w``: the predicted boundary is a line of constant beta/w."""
        curves = self.theory_curves(np.geomspace(1e-5, 1e3, 400))
        out = {}
        for w, c in ([] if curves is None else curves.groupby("weighting", sort=False)):
            f, b = c["predicted_use_fraction"].to_numpy(), c["beta"].to_numpy()
            i = np.flatnonzero((f[:-1] > 0.5) & (f[1:] <= 0.5))
            if len(i):
                out[w] = float(np.sqrt(b[i[0]] * b[i[0] + 1]))
        return out

    def critical_beta_over_w(self) -> float | None:
        """beta*/w of scalar reconstruction weights (beta_eff = beta·|S|/w < 1 for half of the rows)."""
        crit = self.critical_betas()
        if "plain" in crit:
            return crit["plain"]
        if "distribution" in crit and self.reference:
            return crit["distribution"] * self.reference["c_base"]
        return None

    def phase_boundary(self, min_betas: int = 3, tolerance: float = 0.25) -> pd.DataFrame:
        """Measured against predicted phase boundary, per (weighting, latent_kind, aid) group with at
        least ``min_betas`` distinct beta values: the beta at which the rate falls to half its
        plateau. Measured: the mean KL (nats per example) per beta, plateau = its largest value,
        beta_half = the first downward crossing of plateau/2 (linear in rate, geometric in beta).
        Predicted: the same on ``theory_curves``' predicted rate (a fine grid). ``ratio`` =
        measured / predicted; ``within`` = |ratio − 1| <= ``tolerance`` (the aids issue: ±25%).
        A missing crossing gives NaN and says why in ``note``. Source: docs/concepts/theory.md; Alemi et
        al. 2018."""
        cols = ["weighting", "latent_kind", "aid", "n_betas", "plateau_rate", "predicted_plateau_rate",
                "beta_half_measured", "beta_half_predicted", "ratio", "within", "note"]
        r = self.runs
        if r.empty or "kl_prior_loss" not in r:
            return pd.DataFrame(columns=cols)
        r = r.assign(latent_kind=r.get("latent_kind", "discrete"), aid=r.get("aid", "none")).fillna({"aid": "none"})
        curves = self.theory_curves(np.geomspace(1e-4, 1e2, 600))
        rows = []
        for (w, lk, aid), g in r.groupby(["weighting", "latent_kind", "aid"], sort=False):
            m = g.groupby("beta")["kl_prior_loss"].mean().sort_index()
            if len(m) < min_betas:
                continue
            bm, note = _half_crossing(m.index.to_numpy(float), m.to_numpy(float))
            bp, pplat, pnote = float("nan"), float("nan"), "no prediction (reference or Bayes losses missing)"
            if curves is not None and (curves["weighting"] == w).any():
                c = curves[curves["weighting"] == w]
                bp, pnote = _half_crossing(c["beta"].to_numpy(float), c["predicted_rate"].to_numpy(float))
                pplat, pnote = float(c["predicted_rate"].max()), pnote and f"prediction: {pnote}"
            note = "; ".join(x for x in (note, pnote) if x)
            ratio = bm / bp if np.isfinite(bm) and np.isfinite(bp) and bp > 0 else float("nan")
            rows.append({"weighting": w, "latent_kind": lk, "aid": aid, "n_betas": len(m),
                         "plateau_rate": float(m.max()), "predicted_plateau_rate": pplat,
                         "beta_half_measured": bm, "beta_half_predicted": bp, "ratio": ratio,
                         "within": bool(np.isfinite(ratio) and abs(ratio - 1) <= tolerance), "note": note})
        return pd.DataFrame(rows, columns=cols)

    def use_by_length(self, weighting: str = "distribution") -> pd.DataFrame:
        """Measured and predicted use per |S| (the staircase of a ragged-length weighting: under
        ``distribution`` the short examples switch on first, beta* = 1/(|S| c_base)). One row per
        (run, n_tokens): beta, aid, measured_use (fraction of rows with KL >= half their Bayes
        rate), predicted_use (fraction with beta_eff below threshold), kl (mean nats), rows."""
        runs = self.runs[self.runs["weighting"] == weighting] if "weighting" in self.runs else self.runs.iloc[:0]
        out = []
        for _, run in runs.iterrows():
            pe = read_table(Path(run["run_dir"]) / "per_example.parquet")
            if not {"measured_use", "predicted_use"} <= set(pe):
                continue
            g = pe.groupby("n_tokens").agg(measured_use=("measured_use", "mean"), predicted_use=("predicted_use", "mean"),
                                           kl=("kl", "mean"), rows=("kl", "size")).reset_index()
            out.append(g.assign(run_id=run["run_id"], beta=run["beta"], aid=run.get("aid", "none")))
        return pd.concat(out, ignore_index=True) if out else pd.DataFrame(
            columns=["n_tokens", "measured_use", "predicted_use", "kl", "rows", "run_id", "beta", "aid"])


def _find_reference(d: Path, runs: pd.DataFrame) -> Path | None:
    candidates = [d / "base" / "reference"] + [Path(b) / "reference" for b in runs.get("base_dir", pd.Series()).unique()]
    return next((c for c in candidates if (c / "reference.json").exists()), None)


#: the prefix-reference keys on which every run of a prefix study must agree for one reference to stand
#: for them all: every input a stored prefix reference is matched on (``zfree.reference.prefix.MATCH_KEYS``),
#: and its result
PREFIX_AGREE_KEYS = PREFIX_MATCH_KEYS + ("c_base",)


def _prefix_reference(runs: pd.DataFrame) -> tuple[Path | None, str]:
    """The validation reference a prefix-route study's runs used (``zfree.reference.prefix``: the base
    read through the soft token s_0, stored in each run folder), when every run has one and they agree
    on ``PREFIX_AGREE_KEYS``: (its folder, ""). (None, why) when only some runs have one or they
    disagree; (None, "") when no run has one (a study of the other routes)."""
    if runs.empty or "run_dir" not in runs:
        return None, ""
    dirs = [Path(r) / PREFIX_REFERENCE_DIR / "val" for r in runs["run_dir"].dropna()]
    have = [d for d in dirs if (d / "reference.json").is_file()]
    if not have:
        return None, ""
    if len(have) < len(dirs):
        return None, (f"{len(have)} of {len(dirs)} runs read their own prefix-route reference (the base "
                      f"through the soft token s_0; run folder's {PREFIX_REFERENCE_DIR}/val), not this one")
    metas = [read_json(d / "reference.json") for d in have]
    differ = [k for k in PREFIX_AGREE_KEYS if len({json.dumps(m.get(k)) for m in metas}) > 1]
    if differ:
        return None, (f"the runs' prefix-route references differ in {', '.join(differ)} "
                      f"({PREFIX_REFERENCE_DIR}/val of each run folder); each run read its own, not this one")
    return have[0], ""


def load_sweep(sweep_dir: Path | str) -> SweepResults:
    """Load a sweep (or study) folder: its runs, failures and the z-free reference it used: the base
    run's (``base/reference`` or the runs' ``base_dir``), or, in a study whose runs all take z through
    the prefix route, their own reference through the soft token (``_prefix_reference``; reference.json
    ``route`` "prefix"). Where only some runs read a prefix reference, the base run's is loaded with a
    ``note`` saying so."""
    d = check_folder(Path(sweep_dir).resolve())
    runs = runs_table(d)
    errors = [read_json(e) for e in sorted((d / "runs").glob("*/error.json"))]
    prefix_dir, note = _prefix_reference(runs)
    ref_dir = prefix_dir or _find_reference(d, runs)
    reference = examples = None
    if ref_dir is not None:
        reference = read_json(ref_dir / "reference.json")
        if note:
            reference["note"] = note
        examples = read_table(ref_dir / "per_example.parquet")[["id", "n_tokens", "b"]]
        bayes = _bayes_nll(reference.get("data_file"), runs, ref_dir)
        examples["bayes_nll"] = examples["id"].map(bayes).astype(float)
    return SweepResults(d, runs, errors, reference, examples)


def _reference_data_file(data_file: str | None, runs: pd.DataFrame, ref_dir: Path) -> Path | None:
    """The reference's validation file wherever the report runs from: ``data_file`` as stored
    (absolute, or relative to the folder it was scored from: this repository's root for the
    shipped base run, the reference folder, the working directory), else the runs' own
    ``data_dir``/val.jsonl when it has the same name."""
    if not data_file:
        return None
    p = Path(data_file)
    cands = [p] if p.is_absolute() else [ROOT / p, ref_dir / p, Path.cwd() / p]
    cands += [Path(d) / p.name for d in runs.get("data_dir", pd.Series(dtype=str)).dropna().unique()]
    return next((c for c in cands if c.is_file()), None)


def _bayes_nll(data_file: str | None, runs: pd.DataFrame, ref_dir: Path) -> dict[str, float]:
    """id -> log(K/m) from the reference's data file (``_reference_data_file``), else from the runs'
    per-example tables (only the rows they evaluated)."""
    found = _reference_data_file(data_file, runs, ref_dir)
    if found is not None:
        return {p.id: p.bayes_nll for p in load_pairs(found) if p.bayes_nll is not None}
    pe = per_example_table(runs)
    return dict(zip(pe["id"], pe["bayes_nll"])) if "bayes_nll" in pe else {}


def _half_crossing(beta: np.ndarray, rate: np.ndarray) -> tuple[float, str]:
    """The beta where ``rate`` (sorted by beta) first falls from >= plateau/2 to below it,
    geometric in beta and linear in rate between the two grid points; (NaN, why) when it does not."""
    order = np.argsort(beta)
    beta, rate = beta[order], rate[order]
    plateau = float(np.max(rate)) if len(rate) else 0.0
    if plateau <= 0:
        return float("nan"), "the rate is zero at every beta (no plateau)"
    half = plateau / 2
    start = int(np.argmax(rate))
    for i in range(start, len(rate) - 1):
        if rate[i] >= half > rate[i + 1]:
            t = (rate[i] - half) / (rate[i] - rate[i + 1])
            return float(np.exp(np.log(beta[i]) + t * (np.log(beta[i + 1]) - np.log(beta[i])))), ""
    return float("nan"), "the rate does not fall below half its plateau within the beta grid"
