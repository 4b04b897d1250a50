"""The z-free control and the label oracles every CVAE study trains beside its runs
(docs/concepts/controls.md).

A run's **control** (``control_params``) is the run with z held at one value (``latent_source =
"control"``, K = 1): the same data, base, weighting, optimizer, rates, warm-up, steps, batch size,
seed (so the same batches) and evaluation rows, no rate, no aid. It is what a collapsed run would
reach, so z's gain of a run is D_control - D_run, and the fine-tuning gain D_base - D_control is
not credited to z. Fields that cannot change a z-free decoder's training (beta and its schedule,
free bits, K, the posterior, every aid field) are reset to their defaults, so runs that differ only
in them share one control.

A **label oracle** (``oracle_params``) is the control's recipe with z := the row's label value
(``latent_source = "label:<key>"``, K = the label's number of values): its gain over the same
control, Delta R_label, is what a latent carrying that label could buy; its router's
cross-entropy on validation rows estimates H(label | x), and eta = Delta R / H is the exchange rate
theory needs (``zfree.objective.theory.predicted_use``).

An oracle may also be a point of the grid itself (``latent_source: label:<key>`` with its K and its own
fields, e.g. an oracle arm with ``router_clip: global`` beside one with ``own``): it is trained as written,
linked to the control of its own recipe and, with ``null``, given its null oracle: the same point with
``latent_source: null:<key>``.

A **text oracle** (``text_params``, an option of a study: ``ExperimentSpec.text_oracles``) is the
control's recipe with the label written into x (``latent_source = "text:<key>"``, K = 1, no parameter
beyond the control's; ``zfree_lab.run.text_oracle``): its gain over the control, D_control - D_text, is what
the label is worth given as text rather than through z.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from zfree.config import AidConfig, LatentSource, TrainConfig
from zfree.data.labels import capped_values, label_keys_of
from zfree.data.pairs import load_pairs
from zfree_lab.experiment.spec import Point, run_id

#: the fields of a run that a given-z decoder does not see: reset to their defaults in its control (every
#: aid field but word dropout, which weakens the decoder itself: its control is trained with it too)
_RESET = ("beta", "beta_schedule", "beta_warmup_steps", "beta_cycle_steps", "beta_ratio_zero", "beta_ratio_increase",
          "free_bits", "free_bits_mode", "ae_steps",
          "lambda_jsd", "latent_kind", "n_latent", "posterior_features", "d_latent", "n_samples", "prior", "bn_gamma",
          "delta_rate",
          "frozen_decoder_steps",
          # the router's own clip: a control's router (K = 1) has no gradient, so it cannot change the control
          "router_clip", *(f for f in AidConfig.__dataclass_fields__ if f not in ("word_dropout",)))
#: the fields a control keeps from its run (they shape a z-free decoder's training or its evaluation);
#: ``control_params`` sets latent_source, eval_every and checkpoint_every itself. Every flat
#: TrainConfig field is in exactly one of ``_RESET`` and ``SHARED`` (tests/test_controls.py): a new
#: field must be classified, or runs differing only in it would silently share or split controls.
SHARED = ("data_dir", "base_dir", "weighting", "epsilon", "token_alpha", "token_outer", "c_base_source", "shared_prefix",
          "injection",  # the control's decoder takes z (one value) through the same route
          "latent_capacity",  # the control trains the same shared vector (and its one delta) as its run's
          "latent_source", "steps", "batch_size", "lr_backbone", "lr_new", "warmup_backbone", "lr_decay_share",
          "weight_decay",
          "grad_clip", "eval_every", "eval_rows", "decode_rows", "seed", "threads", "device", "precision",
          "checkpoint_every", "checkpoint_every_s", "optimizer", "lora_rank", "lora_alpha", "lora_targets", "micro_batch",
          "keep_prev_checkpoint", "tensorboard", "wandb", "word_dropout", "compile")


#: fields reset in the control (they cannot change a one-value decoder) that an oracle and its null keep from
#: the recipe they are built on: a K >= 2 given z has a router probe with a gradient, and these say how
#: that gradient is clipped (an oracle of a run with ``router_clip=global`` is that run's coupling)
ORACLE_KEEPS = ("router_clip",)


def control_params(flat: dict[str, Any]) -> dict[str, Any]:
    """The flat config of the z-free control of the run ``flat`` (module docstring): K = 1,
    ``latent_source = "control"``, beta 0 (a given z pays no rate), the fields in ``_RESET`` at their
    defaults, evaluated at step 0 and the end only; everything that shapes the decoder's training kept."""
    d = TrainConfig().to_flat()
    out = {**flat, **{k: d[k] for k in _RESET}}
    # evaluated at step 0 and at the end only (the same rows): evaluation draws from its own seeded
    # generator, so this does not change a step of training, and the gains read the final one
    out.update(beta=0.0, n_latent=1, latent_source="control", latent_kind="discrete", eval_every=flat["steps"],
               checkpoint_every=0)
    return TrainConfig.from_flat(out).to_flat()


def _given_params(flat: dict[str, Any], source: LatentSource, n_values: int) -> dict[str, Any]:
    """The control recipe of ``flat`` with z from ``source`` (K = ``n_values``), ``ORACLE_KEEPS`` kept from ``flat``."""
    kept = {k: flat[k] for k in ORACLE_KEEPS if k in flat}
    out = {**control_params(flat), **kept, "n_latent": n_values, "latent_source": str(source)}
    return TrainConfig.from_flat(out).to_flat()


def oracle_params(flat: dict[str, Any], key: str, n_values: int) -> dict[str, Any]:
    """The flat config of the label oracle of ``key`` (z := the row's value, K = ``n_values``) on
    the control recipe of ``flat`` (with its ``ORACLE_KEEPS``)."""
    return _given_params(flat, LatentSource.oracle(key), n_values)


def null_params(flat: dict[str, Any], key: str, n_values: int) -> dict[str, Any]:
    """The flat config of the null oracle of ``key``: the oracle's recipe with z := another row's value
    (``LatentSource`` "null:<key>"): the same K and marginal, nothing about the row's own y. Its gain over
    the control is what K given vectors buy without information (shared bias, capacity); a label's value
    is D_null - D_oracle."""
    return _given_params(flat, LatentSource.null_oracle(key), n_values)


def text_params(flat: dict[str, Any], key: str) -> dict[str, Any]:
    """The flat config of the text oracle of ``key``: the control's recipe of ``flat`` (K = 1) on rows
    whose x holds the label (``LatentSource`` "text:<key>"); its reference is scored on that x."""
    out = {**control_params(flat), "latent_source": str(LatentSource.text_oracle(key))}
    return TrainConfig.from_flat(out).to_flat()


given_run_id = run_id  # names a control or an oracle by its source (``zfree_lab.experiment.spec.run_id``)


def oracle_labels(data_dir: Path | str, wanted: Sequence[str] | None = None) -> dict[str, int]:
    """Label key -> its number of values over train.jsonl + val.jsonl of ``data_dir``: the keys in
    ``wanted`` (a joint ``a*b`` allowed), or (None) every key all rows carry (``label_keys_of``:
    ``strategy`` on the synthetic benchmark, the ``labels`` keys on real data). Keys with fewer than
    2 values are dropped (nothing to carry). Raises ValueError naming the file and row for a wanted
    label a row lacks. A label of more than ``LABEL_VALUE_CAP`` values counts that many (its most
    frequent values and "<other>", ``zfree.data.labels.capped_values``)."""
    rows = [p for s in ("train", "val") for p in load_pairs(Path(data_dir) / f"{s}.jsonl")]
    keys = list(wanted) if wanted is not None else label_keys_of(rows)
    out = {}
    for k in keys:
        n = len(capped_values(rows, k, source=str(data_dir))[0])  # at most LABEL_VALUE_CAP
        if n >= 2:
            out[k] = n
    return out


#: the study folder's record of which control belongs to which run (``with_controls``)
LINKS_FILE = "controls.json"


def with_controls(points: list[Point], labels: dict[str, int] | None, null: bool = True,
                  text: bool = False) -> tuple[list[Point], dict]:
    """``points`` followed by the control of every CVAE point (one per distinct recipe) and, when
    ``labels`` is given, one oracle per label on the recipe of the first point of each seed (its control
    included above: the oracle's gain is paired with the same seed's control) and, with ``null``, beside
    each its null oracle (``null_params``: the label permuted over the rows) and, with ``text``, its text
    oracle (``text_params``: the label written into x); and the links
    ``{"controls": {run_id: control_id}, "oracles": {oracle_id: {"label", "n_values", "control"}},
    "nulls": {oracle_id: null_oracle_id}, "texts": {oracle_id: text_oracle_id}}``
    (written to ``LINKS_FILE`` by the pipeline; ``zfree_lab.experiment.gains`` reads them). Given-z points
    already in ``points`` are kept as they are; each label oracle among them (``label:<key>``, K its
    ``n_latent``) is linked to the control of its own recipe (added) and, with ``null``, given its null
    oracle: the point with z permuted (module docstring). Order: seed by seed (a study stopped part-way holds whole
    seeds), and within a seed the CVAE runs first (the longest), then controls, then oracles."""
    cvae = [p for p in points if p.params.get("latent_source", "posterior") == "posterior"]
    extra: dict[str, dict] = {}
    links: dict = {"controls": {}, "oracles": {}, "nulls": {}, "texts": {}}
    for p in cvae:
        c = control_params(p.params)
        links["controls"][p.run_id] = given_run_id(c)
        extra.setdefault(given_run_id(c), c)
    first_of_seed = {}
    for p in cvae:
        first_of_seed.setdefault(p.params.get("seed"), p)
    for p in first_of_seed.values() if labels else ():
        for key, n in labels.items():
            o = oracle_params(p.params, key, n)
            extra.setdefault(given_run_id(o), o)
            links["oracles"][given_run_id(o)] = {"label": key, "n_values": n, "control": links["controls"][p.run_id]}
            if null:
                z = null_params(p.params, key, n)
                extra.setdefault(given_run_id(z), z)
                links["nulls"][given_run_id(o)] = given_run_id(z)
            if text:
                t = text_params(p.params, key)
                extra.setdefault(given_run_id(t), t)
                links["texts"][given_run_id(o)] = given_run_id(t)
    for p in points:  # oracle arms written in the grid: their own recipe's control and null
        source = LatentSource.parse(p.params.get("latent_source"))
        if source.kind != "label":
            continue
        c = control_params(p.params)
        extra.setdefault(given_run_id(c), c)
        n = int(p.params["n_latent"])
        links["oracles"][p.run_id] = {"label": source.label, "n_values": n, "control": given_run_id(c)}
        if null:  # the oracle as written, z permuted
            z = TrainConfig.from_flat({**p.params, "latent_source": str(LatentSource.null_oracle(source.label))})
            z = z.to_flat()
            extra.setdefault(given_run_id(z), z)
            links["nulls"][p.run_id] = given_run_id(z)
        if text:  # the label written into x, on the oracle's own recipe
            t = text_params(p.params, source.label)
            extra.setdefault(given_run_id(t), t)
            links["texts"][p.run_id] = given_run_id(t)
    seen = {p.run_id for p in points}
    out = list(points) + [Point(i, f) for i, f in extra.items() if i not in seen]
    seeds = list(dict.fromkeys(p.params.get("seed") for p in out))
    return sorted(out, key=lambda p: seeds.index(p.params.get("seed"))), links
