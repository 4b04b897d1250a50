"""What z could explain and what it did, against the z-free control: the
available-gain table of the label oracles and each CVAE run's gain, with bootstrap
intervals over the evaluated rows.

Units: D (distortion) is the reconstruction NLL in nats per example (sequence), |S|·lbar, averaged
over the evaluated validation rows (the same seeded rows for every run of a study,
``zfree_lab.run.split.spread_sample``); rates are nats per example.

  z gain            D_control - D_run          (paired per row)
  fine-tuning gain  D_base - D_control         (|S|·b: the frozen base on the same rows)
  Delta R_label     D_control - D_oracle       (the oracle's z := the label)
  H(label | x)      the better (lower mean) of two cross-entropies on the rows, each an upper bound:
                    the oracle's trained router -log p(label | x) (a linear probe of the separator
                    state) and the label's train marginal (add-one smoothed); ``H_source`` names it
  eta               Delta R_label / H(label | x): reconstruction nats bought per nat of rate
  Delta R_null      D_control - D_null         the null oracle (the label permuted over the rows: the
                                               same K and marginal, nothing about y): what K given
                                               vectors buy without information; 0 for a clean arm
  label_value       D_null - D_oracle          what the label itself is worth, capacity aside
  flipped           D_flipped - D_oracle       the trained oracle evaluated with another row's label
                                               (its D_shuffled): how much its decoder reads the label
  oracle_net        D_control - marginal NLL   the oracle's z summed out under its router (rate paid)
  delta_R_text      D_control - D_text         the text oracle (a study's option: the label written into x,
                                               K = 1, no new parameter): what the label is worth as text;
                                               beside Delta R_label, whether the latent route delivers it

Within one run and net of its rate (``zfree.evaluate.readouts``; NaN for runs written before the readouts):

  use_shuffled      D_shuffled - D_q          nats of y the decoder reads from z (another row's posterior)
  use_prior         D_prior - D_q             the same against z drawn from the prior/router
  net_gain          D_control - marginal NLL  the CVAE against its control as a model of y given x, rate paid
  gain_minus_rate   z_gain - rate             the same net of the rate through the ELBO (<= net_gain)
  exchange_rate     z_gain / rate             nats of distortion bought per nat of rate

  z_switched_on     use_shuffled's interval above 0, its estimate >= USE_FLOOR and >= 2 codes: z carries y
                    that the decoder uses (a collapsed run's decoders differ by ~1e-5 nats/example, which
                    thousands of rows can put above 0 without z carrying anything worth the name)
  z_better_model    net_gain's interval above 0: the CVAE models y given x better than its control

Intervals: the 95 % percentile bootstrap over evaluated rows (``scipy.stats.bootstrap``, 2000
resamples, rows resampled jointly for every paired quantity, seed 0). A label's gain counts as
distinguishable from zero when its interval lies above 0 (``delta_R_lo > 0``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import bootstrap

from zfree.config import run_identity
from zfree.core.io import read_json, read_table
from zfree.data.labels import label_value, label_values
from zfree.data.pairs import load_pairs
from zfree.objective.theory import predicted_use
from zfree_lab.run.run_config import read_run_config
from zfree_lab.experiment.controls import LINKS_FILE, control_params

N_RESAMPLES = 2000
#: the least within-model use (nats/example) that reads as "z switched on" (module docstring)
USE_FLOOR = 0.01
CONFIDENCE = 0.95
#: the per-example columns a gain reads
_COLS = ["id", "n_tokens", "lbar", "kl", "b", "beta_eff"]
#: the readout columns a gain reads where the run wrote them (``zfree.evaluate.readouts``)
_READOUTS = ["d_prior", "d_shuffled", "marginal_nll"]


def interval(*columns: np.ndarray, statistic=None, seed: int = 0) -> tuple[float, float, float]:
    """(estimate, low, high): ``statistic`` (default: the mean of one column) and its 95 % percentile
    bootstrap interval, the rows of all ``columns`` (each (rows,)) resampled together. Fewer than 2
    rows or a constant statistic: the interval is the estimate itself."""
    stat = statistic or (lambda a, axis=-1: np.mean(a, axis=axis))
    cols = [np.asarray(c, float) for c in columns]
    est = float(stat(*cols, axis=-1))
    if len(cols[0]) < 2:
        return est, est, est
    res = bootstrap(tuple(cols), stat, paired=True, vectorized=True, n_resamples=N_RESAMPLES,
                    confidence_level=CONFIDENCE, method="percentile", random_state=np.random.default_rng(seed))
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return (est, est, est) if not (np.isfinite(lo) and np.isfinite(hi)) else (est, lo, hi)


def _per_example(run_dir: str) -> pd.DataFrame:
    """The run's per-row D = |S| lbar, D_base = |S| b, KL and the readouts (NaN where the run did not write them)."""
    import pyarrow.parquet as pq

    f = Path(run_dir) / "per_example.parquet"
    have = set(pq.read_schema(f).names) if f.is_file() else set()
    pe = read_table(f, columns=_COLS + [c for c in _READOUTS if c in have])
    pe = pe.assign(**{c: np.nan for c in _READOUTS if c not in pe})
    return pe.assign(D=pe["n_tokens"] * pe["lbar"], D_base=pe["n_tokens"] * pe["b"]).set_index("id")


def readout_gains(pr: pd.DataFrame, pc: pd.DataFrame) -> dict[str, float]:
    """The within-run and net columns of the module docstring for a run's rows ``pr`` paired with its
    control's ``pc`` (``_per_example`` frames in one row order), each with its row-bootstrap interval
    (``_lo``/``_hi``, the within-seed interval); NaN where the run has no readouts."""
    out: dict[str, float] = {}
    D, Dc, kl = pr["D"].to_numpy(), pc["D"].to_numpy(), pr["kl"].to_numpy(float)
    pieces = {"use_shuffled": pr["d_shuffled"].to_numpy() - D, "use_prior": pr["d_prior"].to_numpy() - D,
              "net_gain": Dc - pr["marginal_nll"].to_numpy(), "gain_minus_rate": Dc - D - kl}
    for name, v in pieces.items():
        est = interval(v) if np.isfinite(v).all() else (np.nan, np.nan, np.nan)
        out.update({name: est[0], f"{name}_lo": est[1], f"{name}_hi": est[2]})
    rate = float(kl.mean())
    out["exchange_rate"] = float((Dc - D).mean()) / rate if rate > 1e-9 else np.nan
    return out


def _paired(a: pd.DataFrame, b: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The rows both tables evaluated, in one order."""
    ids = a.index.intersection(b.index)
    return a.loc[ids], b.loc[ids]


def _ratio(a, b, axis=-1):
    return np.mean(a, axis=axis) / np.mean(b, axis=axis)


def oracle_table(study_dir: Path | str) -> pd.DataFrame:
    """One row per label oracle of the study: label, n_values, rows, D_control, delta_R (+ _lo,
    _hi), H (+ _lo, _hi), eta (+ _lo, _hi), distinguishable (delta_R_lo > 0), finetune_gain, and the
    run ids. Empty (with the columns) when the study has no oracle or its control is missing."""
    cols = ["label", "n_values", "rows", "D_control", "delta_R", "delta_R_lo", "delta_R_hi", "H", "H_lo", "H_hi",
            "H_source", "eta", "eta_lo", "eta_hi", "distinguishable", "finetune_gain", *_NULL_COLUMNS,
            "oracle_run_id", "control_run_id", "null_run_id", "text_run_id"]
    runs_dir = Path(study_dir) / "runs"
    rows = []
    links = links_of(study_dir)
    for oid, link in links["oracles"].items():
        cid = link["control"]
        if not all((runs_dir / i / "per_example.parquet").exists() for i in (oid, cid)):
            continue
        po, pc = _paired(_per_example(str(runs_dir / oid)), _per_example(str(runs_dir / cid)))
        dR = pc["D"].to_numpy() - po["D"].to_numpy()
        h, h_source = _label_entropy(runs_dir / oid, link["label"], po)
        d, dlo, dhi = interval(dR)
        hh, hlo, hhi = interval(h)
        e, elo, ehi = interval(dR, h, statistic=_ratio) if hh > 0 else (np.nan, np.nan, np.nan)
        rows.append({"label": link["label"], "n_values": int(link["n_values"]), "rows": len(dR),
                     "D_control": float(pc["D"].mean()), "delta_R": d, "delta_R_lo": dlo, "delta_R_hi": dhi,
                     "H": hh, "H_lo": hlo, "H_hi": hhi, "H_source": h_source, "eta": e, "eta_lo": elo, "eta_hi": ehi,
                     "distinguishable": bool(dlo > 0),
                     "finetune_gain": float((pc["D_base"] - pc["D"]).mean()),
                     **_null_and_flipped(runs_dir, links["nulls"].get(oid), po, pc, links["texts"].get(oid)),
                     "oracle_run_id": oid, "control_run_id": cid, "null_run_id": links["nulls"].get(oid),
                     "text_run_id": links["texts"].get(oid)})
    return pd.DataFrame(rows, columns=cols).sort_values("delta_R", ascending=False).reset_index(drop=True)


#: the oracle table's null, flipped-label, net and text-oracle columns (module docstring), each with _lo / _hi
_NULL_COLUMNS = [f"{c}{s}" for c in ("delta_R_null", "label_value", "flipped", "oracle_net", "delta_R_text")
                 for s in ("", "_lo", "_hi")]


def _null_and_flipped(runs_dir: Path, null_id: str | None, po: pd.DataFrame, pc: pd.DataFrame,
                      text_id: str | None = None) -> dict:
    """The oracle's flipped-label loss and net gain (its own readouts) and, when its null oracle has
    finished, Delta R_null and the label's value, each (estimate, _lo, _hi) over the rows all three
    evaluated; when its text oracle has finished, Delta R_text over the rows it and the control evaluated
    (the same ids: its x differs, its rows do not); NaN where missing."""
    out = dict.fromkeys(_NULL_COLUMNS, np.nan)

    def put(name, v):
        if np.isfinite(v).all() and len(v):
            out[name], out[f"{name}_lo"], out[f"{name}_hi"] = interval(v)

    put("flipped", po["d_shuffled"].to_numpy() - po["D"].to_numpy())
    put("oracle_net", pc["D"].to_numpy() - po["marginal_nll"].to_numpy())
    if null_id is not None and (runs_dir / null_id / "per_example.parquet").exists():
        pn = _per_example(str(runs_dir / null_id))
        ids = po.index.intersection(pn.index)
        put("delta_R_null", pc.loc[ids, "D"].to_numpy() - pn.loc[ids, "D"].to_numpy())
        put("label_value", pn.loc[ids, "D"].to_numpy() - po.loc[ids, "D"].to_numpy())
    if text_id is not None and (runs_dir / text_id / "per_example.parquet").exists():
        pt = _per_example(str(runs_dir / text_id))
        ids = pc.index.intersection(pt.index)
        put("delta_R_text", pc.loc[ids, "D"].to_numpy() - pt.loc[ids, "D"].to_numpy())
    return out


def _label_entropy(oracle_dir: Path, key: str, po: pd.DataFrame) -> tuple[np.ndarray, str]:
    """Per evaluated row, -log p(label) under the better of the oracle's router (its KL column:
    exactly -log p(label | x) for a one-hot q) and the train marginal of ``key`` (add-one smoothed,
    values indexed as the oracle's: sorted over train + val); the name of the one taken."""
    router = po["kl"].to_numpy(float)
    cfg = read_run_config(oracle_dir / "config.json") if (oracle_dir / "config.json").exists() else {}
    data = Path(cfg.get("data_dir", oracle_dir / "missing"))
    if not ((data / "train.jsonl").exists() and (data / "val.jsonl").exists()):
        return router, "router"  # the data folder is not reachable from here: the router alone
    train, val = load_pairs(data / "train.jsonl"), load_pairs(data / "val.jsonl")
    values = label_values(train + val, key)
    counts = pd.Series([label_value(p, key) for p in train]).value_counts().reindex(values, fill_value=0)
    logp = np.log((counts.to_numpy(float) + 1) / (len(train) + len(values)))
    of = {p.id: values.index(label_value(p, key)) for p in val}
    marginal = -logp[[of[i] for i in po.index]]
    return (router, "router") if router.mean() <= marginal.mean() else (marginal, "train marginal")


def best_label(oracles: pd.DataFrame) -> pd.Series | None:
    """The oracle row with the largest Delta R among the distinguishable ones (else the largest), or None."""
    if oracles.empty:
        return None
    dist = oracles[oracles["distinguishable"]]
    return (dist if len(dist) else oracles).iloc[0]


def run_gains(study_dir: Path | str, runs: pd.DataFrame, oracles: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per CVAE run: run_id, control_run_id, rows, D, D_control, D_base, z_gain (+ _lo,
    _hi), finetune_gain (+ _lo, _hi), rate (mean KL), the best label's delta_R (available_gain) and
    the share z got (gain_share = z_gain / available_gain), and ``z_gain_positive`` (its interval
    above 0). ``runs``: the CVAE runs (``zfree_lab.experiment.results.collect_runs``). A run the study
    did not plan (one trained into its ``runs/`` later, e.g. ``zfree train --config <run>/config.json
    --set handover_margin=0.9 --out <study>/runs/variant-...``) is paired with the finished control
    whose config is its recipe's control (``_recipe_control``). Runs whose control has not finished
    get NaN gains."""
    runs_dir = Path(study_dir) / "runs"
    oracles = oracle_table(study_dir) if oracles is None else oracles
    best = best_label(oracles)
    controls = links_of(study_dir)["controls"]
    rows = []
    for _, r in runs.iterrows():
        cid = controls.get(r["run_id"]) or _recipe_control(Path(r["run_dir"]), runs_dir)
        row = {"run_id": r["run_id"], "control_run_id": cid}
        if cid is not None and (runs_dir / cid / "per_example.parquet").exists():
            pr, pc = _paired(_per_example(r["run_dir"]), _per_example(str(runs_dir / cid)))
            g = interval(pc["D"].to_numpy() - pr["D"].to_numpy())
            f = interval(pc["D_base"].to_numpy() - pc["D"].to_numpy())
            row.update(rows=len(pr), D=float(pr["D"].mean()), D_control=float(pc["D"].mean()),
                       D_base=float(pc["D_base"].mean()), z_gain=g[0], z_gain_lo=g[1], z_gain_hi=g[2],
                       finetune_gain=f[0], finetune_gain_lo=f[1], finetune_gain_hi=f[2], rate=float(pr["kl"].mean()),
                       z_gain_positive=bool(g[1] > 0), **readout_gains(pr, pc))
        if best is not None:
            row.update(best_label=best["label"], available_gain=float(best["delta_R"]),
                       gain_share=row.get("z_gain", np.nan) / best["delta_R"] if best["delta_R"] > 0 else np.nan)
            row.update(_eta_prediction(r["run_dir"], best))
        row["z_used"] = bool(r.get("latent_used", False)) and bool(row.get("z_gain_positive", False))
        codes = r.get("codes_used", np.nan)
        row["z_switched_on"] = bool(row.get("use_shuffled_lo", np.nan) > 0 and row.get("use_shuffled", np.nan) >= USE_FLOOR
                                    and not (pd.notna(codes) and codes < 2))
        row["z_better_model"] = bool(row.get("net_gain_lo", np.nan) > 0)
        rows.append(row)
    return pd.DataFrame(rows, columns=list(dict.fromkeys(["run_id", "control_run_id", *GAIN_COLUMNS,
                                                          *(k for r in rows for k in r)])))


def _recipe_control(run_dir: Path, runs_dir: Path) -> str | None:
    """The folder name of the finished z-free control in ``runs_dir`` whose config equals
    ``zfree_lab.experiment.controls.control_params`` of the run in ``run_dir`` (both read with their paths
    resolved; compared as ``zfree.config.run_identity``, so a control written before a field existed still
    matches), or None."""
    if not (run_dir / "config.json").exists():
        return None
    want = run_identity(control_params(read_run_config(run_dir / "config.json")))
    for c in sorted(runs_dir.iterdir()) if runs_dir.is_dir() else []:
        f = c / "config.json"
        if c != run_dir and (c / "per_example.parquet").exists() and f.exists():
            have = read_run_config(f)
            if have.get("latent_source") == "control" and run_identity(have) == want:
                return c.name
    return None


def _eta_prediction(run_dir: str, best: pd.Series) -> dict:
    """Theory with the exchange rate (``theory.predicted_use(exchange_rate=eta)``): the share of the
    run's evaluated rows where beta_eff < eta of the best label (no Bayes excess term: unknown on
    real data); NaN without a positive eta."""
    eta = float(best["eta"])
    if not (np.isfinite(eta) and eta > 0):
        return {"eta": eta, "predicted_use_fraction_eta": np.nan}
    be = read_table(Path(run_dir) / "per_example.parquet", columns=["beta_eff"])["beta_eff"].to_numpy(float)
    return {"eta": eta, "predicted_use_fraction_eta": float(predicted_use(be, exchange_rate=eta).mean())}


#: the gain columns summary.csv carries (beside each run's own metrics); ``z_used``: measured use
#: (rate and >= 2 codes, ``zfree_lab.run.metrics.measured_use``) *and* a z gain whose interval lies above 0
GAIN_COLUMNS = ["D", "D_control", "D_base", "z_gain", "z_gain_lo", "z_gain_hi", "finetune_gain", "rate",
                "z_gain_positive", "z_used", "use_shuffled", "use_shuffled_lo", "use_shuffled_hi", "use_prior",
                "use_prior_lo", "use_prior_hi", "net_gain", "net_gain_lo", "net_gain_hi", "gain_minus_rate",
                "gain_minus_rate_lo", "gain_minus_rate_hi", "exchange_rate", "z_switched_on", "z_better_model",
                "best_label", "available_gain", "gain_share", "eta", "predicted_use_fraction_eta"]


def links_of(study_dir: Path | str) -> dict:
    """The study's run -> control and oracle -> (label, control) links (``controls.json``); empty
    links when the study trained no control."""
    f = Path(study_dir) / LINKS_FILE
    links = read_json(f) if f.exists() else {}
    return {"controls": links.get("controls", {}), "oracles": links.get("oracles", {}), "nulls": links.get("nulls", {}),
            "texts": links.get("texts", {})}
