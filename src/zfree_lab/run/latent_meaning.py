"""What a discrete latent carries: each value's meaning, described from the evaluation rows.

Three descriptions, each computed on the rows of one evaluation and none needing a decode:

1. **Promoted tokens and phrases** (``token_lifts``, ``ngram_lifts``): for value k and each y token
   of each row (teacher-forced, the row's own y), the lift

       lift_k(t) = log p(y_t | x, y_<t, z = k) - log sum_{j != k} w_j p(y_t | x, y_<t, z = j)   [nats]

   with w_j = q(z = j | x, y) renormalised over j != k (uniform over j != k when q puts all its mass
   on k). An n-gram's lift is the sum of its tokens' lifts; per value, n-grams are ranked by their mean
   lift over their occurrences (at least ``MIN_COUNT``). No word is filtered: a stop-word that
   value k promotes ranks where its lift puts it; a mean lift of 0 or below promotes nothing (the
   value's promoted tokens and phrases leave it out; a collapsed run's value may promote none).
2. **Derived properties of y** (``text_properties``, ``property_alignment``): a fixed set computed
   from the text alone (``PROPERTIES``: length in tokens and in words by quartile, number of
   sentences, first word, last punctuation, whether y opens with a word of x), every label the rows
   carry, and, on the synthetic benchmark only (the generator's ``metadata.json`` lists its
   strategies), the relation "y = s(x)" for each listed s. Each is ranked by its mutual information
   with the posterior argmax (nats), against a permutation null of the argmax within strata of x
   (``zfree_lab.run.property_alignment``: the test, its Bonferroni level and the guard that the
   posterior q itself carries the alignment); per value, the same test of [argmax = k].
3. **Exemplars** (``exemplars``): the rows with the highest q(z = k | x, y), x and y at full length.

``value_sentences`` joins them into one descriptive sentence per value. Descriptions, not causes:
the permutation test guards against chance alignment only.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float
from numpy.typing import ArrayLike

from zfree.data.pairs import Pair
from zfree_lab.run.property_alignment import (ALPHA, MIN_POSTERIOR_MI, N_PERMUTATIONS,  # noqa: F401 - re-exported
                                               POSTERIOR_SHARE, per_value_alignment, posterior_mi, property_alignment)

#: an n-gram is ranked only with at least this many occurrences over the evaluation rows
MIN_COUNT = 3
#: n-grams up to this length
MAX_N = 3
#: n-grams kept per value and length in the tidy table (the JSON keeps the first few of them)
TOP = 10
#: first words beyond the most common ones are pooled as "other"
FIRST_WORDS = 8
#: rows shown per value
N_EXEMPLARS = 3
#: whether an evaluation collects the token lifts (off only to time an evaluation without them)
COLLECT_LIFTS = True
#: the properties computed from text alone (labels and the generator's relations are added per data)
PROPERTIES = ("y length (tokens)", "y length (words)", "sentences", "first word", "last punctuation",
              "y opens with a word of x")


def token_lifts(target_logprobs: Float[torch.Tensor, "batch K seq"], q: Float[torch.Tensor, "batch K"],
                target_mask: Bool[torch.Tensor, "batch seq"]) -> Float[torch.Tensor, "batch K seq"]:
    """lift_k(t) in nats (module docstring, item 1): log p(y_t | z = k) minus the log of the
    posterior-weighted mixture of the other values' p(y_t | z = j), per row, value and position;
    0 where ``target_mask`` is False. ``target_logprobs``: per-token log-probabilities in nats under
    each value, the decoder's (B, K, T) layout; ``q``: the posterior (B, K), rows summing to 1.
    Raises ValueError for K < 2 (a lift needs another value) or mismatched shapes."""
    B, K, T = target_logprobs.shape
    if K < 2:
        raise ValueError(f"token_lifts needs K >= 2 latent values, got K = {K}")
    if q.shape != (B, K) or target_mask.shape != (B, T):
        raise ValueError(f"shapes: target_logprobs {tuple(target_logprobs.shape)}, q {tuple(q.shape)}, "
                         f"target_mask {tuple(target_mask.shape)}: expected (B, K, T), (B, K), (B, T)")
    lp = target_logprobs.double()
    off = 1.0 - torch.eye(K, dtype=lp.dtype, device=lp.device)  # (k, j): 1 for j != k
    w = q.double().clamp_min(0)[:, None, :] * off  # (B, k, j)
    s = w.sum(-1, keepdim=True)
    w = torch.where(s > 1e-9, w / s.clamp_min(1e-300), (off / (K - 1)).expand(B, K, K))
    mix = torch.logsumexp(lp[:, None, :, :] + torch.log(w)[..., None], dim=2)  # (B, k, T)
    lift = (lp - mix).where(target_mask[:, None, :], torch.zeros((), dtype=lp.dtype, device=lp.device))
    return lift.to(target_logprobs.dtype)


@dataclass
class MeaningRows:
    """Per evaluated row (in evaluation order): its id, its y token ids (the supervised positions,
    the end token included) and their lifts (K, |S|) in nats. Filled batch by batch (``add``)."""

    ids: list = field(default_factory=list)
    tokens: list = field(default_factory=list)
    lifts: list = field(default_factory=list)

    def add(self, ids: Sequence, input_ids: torch.Tensor, target_mask: torch.Tensor, lifts: torch.Tensor) -> None:
        """One batch: ``input_ids``/``target_mask`` (B, T) and ``token_lifts``' (B, K, T)."""
        ids_np, mask_np, lift_np = input_ids.cpu().numpy(), target_mask.cpu().numpy(), lifts.float().cpu().numpy()
        for b, rid in enumerate(ids):
            self.ids.append(rid)
            self.tokens.append(ids_np[b][mask_np[b]].tolist())
            self.lifts.append(lift_np[b][:, mask_np[b]])


def ngram_lifts(rows: MeaningRows, decode=None, *, max_n: int = MAX_N, min_count: int = MIN_COUNT,
                top: int = TOP) -> pd.DataFrame:
    """Per value k and n-gram length n (1..``max_n``): the ``top`` n-grams of at least ``min_count``
    occurrences, ranked by their mean lift (nats, summed over the n-gram's tokens). Columns: value,
    n, text (``decode(list of ids)``, else the ids), count (occurrences), rows (rows holding it),
    mean_lift, rank (1 = most promoted)."""
    if not rows.lifts:
        return pd.DataFrame(columns=["value", "n", "text", "count", "rows", "mean_lift", "rank"])
    K = rows.lifts[0].shape[0]
    sums: dict[tuple, np.ndarray] = {}
    count: Counter = Counter()
    in_rows: Counter = Counter()
    for toks, lift in zip(rows.tokens, rows.lifts):
        csum = np.concatenate([np.zeros((K, 1)), np.cumsum(lift, axis=1, dtype=np.float64)], axis=1)  # (K, L + 1)
        seen = set()
        for n in range(1, max_n + 1):
            for i in range(len(toks) - n + 1):
                key = tuple(toks[i:i + n])
                sums[key] = sums.get(key, 0.0) + (csum[:, i + n] - csum[:, i])
                count[key] += 1
                seen.add(key)
        in_rows.update(seen)
    keys = [k for k, c in count.items() if c >= min_count]
    if not keys:
        return pd.DataFrame(columns=["value", "n", "text", "count", "rows", "mean_lift", "rank"])
    mean = np.stack([sums[k] / count[k] for k in keys])  # (G, K)
    out = []
    for n in range(1, max_n + 1):
        sel = [i for i, k in enumerate(keys) if len(k) == n]
        for v in range(K):
            for rank, i in enumerate(sorted(sel, key=lambda i: -mean[i, v])[:top], start=1):
                key = keys[i]
                out.append({"value": v, "n": n, "text": decode(list(key)) if decode else " ".join(map(str, key)),
                            "count": count[key], "rows": in_rows[key], "mean_lift": float(mean[i, v]), "rank": rank})
    return pd.DataFrame(out)


def _quartile_bins(values: np.ndarray) -> list[str]:
    """Each (integer) value's quartile bin as text ("12-15"): bins [e_i, e_i+1) between the values'
    own rounded quartiles, the last one closed."""
    e = [int(v) for v in np.unique(np.quantile(values, [0, 0.25, 0.5, 0.75, 1.0]).round())]
    if len(e) < 2:
        return [str(int(v)) for v in values]
    idx = np.clip(np.searchsorted(e, values, side="right") - 1, 0, len(e) - 2)
    his = [e[i + 1] - 1 for i in range(len(e) - 2)] + [e[-1]]
    names = [f"{lo}-{hi}" if hi > lo else str(lo) for lo, hi in zip(e[:-1], his)]
    return [names[i] for i in idx]


_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def text_properties(pairs: Sequence[Pair], n_tokens: "ArrayLike | None" = None,
                    strategies: Sequence[str] | None = None) -> pd.DataFrame:
    """The derived properties of each row's y (module docstring, item 2) as text levels, one column a
    property, one row a pair. ``n_tokens``: the rows' supervised token counts (the evaluation's
    n_tokens column); without it the token length is left out. ``strategies``: the generator's
    strategy names (``zfree.data.synth.STRATEGIES``) from the data's metadata.json: adds "y = s(x)"
    (the names of every listed s that maps x to y, joined by "|", or "none")."""
    ys = [p.y for p in pairs]
    words = [y.split() for y in ys]
    cols: dict[str, list] = {}
    if n_tokens is not None:
        cols["y length (tokens)"] = _quartile_bins(np.asarray(n_tokens, dtype=float))
    cols["y length (words)"] = _quartile_bins(np.array([len(w) for w in words], dtype=float))
    cols["sentences"] = [str(min(3, max(1, len(re.findall(r"[.!?]+(?=\s|$)", y))))).replace("3", "3+") for y in ys]
    first = [(_WORD.findall(w[0]) or [""])[0].lower() if w else "" for w in words]
    common = {w for w, _ in Counter(first).most_common(FIRST_WORDS)}
    cols["first word"] = [w if w in common else "other" for w in first]
    cols["last punctuation"] = [y.rstrip()[-1] if y.strip() and y.rstrip()[-1] in ".!?,;:" else "none" for y in ys]
    cols["y opens with a word of x"] = [str(bool(f) and f in {t.lower() for t in _WORD.findall(p.x)})
                                        for f, p in zip(first, pairs)]
    for key in sorted({k for p in pairs for k in (p.labels or {})}):
        cols[f"label/{key}"] = [str((p.labels or {}).get(key, "")) for p in pairs]
    if strategies:
        cols["y = s(x)"] = _relations(pairs, strategies)
    return pd.DataFrame(cols)


def _relations(pairs: Sequence[Pair], strategies: Sequence[str]) -> list[str]:
    """Per pair, the listed strategies s with s(x) = y (digit strings), joined by "|"; "none" if none."""
    from zfree.data.synth import STRATEGIES

    fns = {s: STRATEGIES[s] for s in strategies if s in STRATEGIES}
    out = []
    for p in pairs:
        try:
            x, y = tuple(int(t) for t in p.x.split()), tuple(int(t) for t in p.y.split())
        except ValueError:
            out.append("none")
            continue
        out.append("|".join(s for s, f in fns.items() if f(x) == y) or "none")
    return out


def exemplars(q: np.ndarray, pairs: Sequence[Pair], n: int = N_EXEMPLARS) -> pd.DataFrame:
    """Per value k the ``n`` rows with the highest q(z = k | x, y): columns value, rank, id, q, x, y
    (full length). ``q``: (N, K) posterior probabilities in evaluation order."""
    out = []
    for k in range(q.shape[1]):
        for r, i in enumerate(np.argsort(-q[:, k], kind="stable")[:n], start=1):
            out.append({"value": k, "rank": r, "id": pairs[i].id, "q": float(q[i, k]), "x": pairs[i].x, "y": pairs[i].y})
    return pd.DataFrame(out)


def value_sentences(assign: np.ndarray, props: pd.DataFrame, alignment: pd.DataFrame, ngrams: pd.DataFrame,
                    n_tokens: "ArrayLike | None", K: int, per_value: dict[int, pd.DataFrame] | None = None
                    ) -> dict[int, str]:
    """value -> one descriptive sentence, for each value with rows: its share of rows, the most
    over-represented level of its best passing property (its own, ``per_value``, else the overall
    one), its most promoted n-gram (the shortest ranked first, where its mean lift reads above +0.00 nats:
    none in a collapsed run) and its median y length in tokens against the other values'."""
    assign = np.asarray(assign)
    overall = alignment[alignment["passes"]].head(1)
    out = {}
    for k in range(K):
        mine = assign == k
        if not mine.any():
            continue
        share = f"{mine.mean():.0%} of rows" if mine.mean() >= 0.005 else f"{int(mine.sum())} of {len(mine)} rows"
        parts = [f"value {k} ({share})"]  # a value of 1 row in 300 is not "0% of rows"
        best = overall if per_value is None else per_value.get(k, overall)
        best = best[best["passes"]].head(1) if len(best) else best
        if len(best):
            prop = best["property"].iloc[0]
            col = props[prop].astype(str)
            share_k, share = col[mine].value_counts(normalize=True), col.value_counts(normalize=True)
            level = (share_k - share.reindex(share_k.index)).idxmax()
            parts.append(f"{prop} = '{level}' in {share_k[level]:.0%} of its rows vs {share[level]:.0%} of all")
        top = ngrams[(ngrams["value"] == k) & (ngrams["rank"] == 1)].sort_values("n") if len(ngrams) else ngrams
        top = top[top["mean_lift"].round(2) > 0] if len(top) else top  # "+0.00 nats" promotes nothing
        if len(top):
            t = top.iloc[0]
            parts.append(f"promotes {t['text']!r} (+{t['mean_lift']:.2f} nats, {int(t['count'])}x)")
        if n_tokens is not None and (~mine).any():
            nt = np.asarray(n_tokens)
            a, b = float(np.median(nt[mine])), float(np.median(nt[~mine]))
            if a != b:
                parts.append(f"{'longer' if a > b else 'shorter'}: median {a:g} tokens vs {b:g}")
        out[k] = parts[0] + ": " + "; ".join(parts[1:]) if len(parts) > 1 else parts[0]
    return out


def latent_meaning(assign: np.ndarray, pairs: Sequence[Pair], *, q: np.ndarray | None = None,
                   rows: MeaningRows | None = None, n_tokens: "ArrayLike | None" = None, decode=None,
                   strategies: Sequence[str] | None = None, source: str = "posterior argmax",
                   seed: int = 0, strata: np.ndarray | None = None, strata_name: str = "x") -> tuple[dict, pd.DataFrame]:
    """All of the module's descriptions for one evaluation: (the JSON-ready dict, the tidy table with one
    row per n-gram (kind "ngram") and per property (kind "property")). ``assign``: (N,) value per row,
    named by ``source``; ``q``: (N, K) posterior (None for clusters); ``rows``: the lifts (None: no token
    description); ``strata`` (N,): what the permutation null conditions on, named ``strata_name``
    (default: the rows' x)."""
    assign = np.asarray(assign)
    K = int(q.shape[1]) if q is not None else int(assign.max()) + 1 if len(assign) else 0
    props = text_properties(pairs, n_tokens, strategies)
    xs = (np.array([p.x for p in pairs], dtype=object) if strata is None  # shuffles within equal x: beyond x
          else np.asarray(strata))
    align, notes = property_alignment(props, assign, seed=seed, q=q, groups=xs)
    per_value = per_value_alignment(props, assign, K, seed=seed, q=q, groups=xs)
    ngrams = ngram_lifts(rows, decode) if rows is not None and rows.lifts else ngram_lifts(MeaningRows())
    sentences = value_sentences(assign, props, align, ngrams, n_tokens, K, per_value)
    ex = exemplars(q, pairs) if q is not None else pd.DataFrame()
    values = []
    for k in range(K):  # its promoted tokens and phrases: a mean lift of 0 or below promotes nothing
        g = ngrams[(ngrams["value"] == k) & (ngrams["mean_lift"] > 0)] if len(ngrams) else ngrams
        values.append({"value": k, "share": float((assign == k).mean()) if len(assign) else math.nan,
                       "sentence": sentences.get(k, f"value {k} (0% of rows)"),
                       "properties": per_value[k].head(3).to_dict("records") if k in per_value else [],
                       "tokens": g[g["n"] == 1].head(5).to_dict("records") if len(g) else [],
                       "phrases": g[g["n"] > 1].sort_values("mean_lift", ascending=False).head(5).to_dict("records")
                       if len(g) else [],
                       "exemplars": ex[ex["value"] == k].to_dict("records") if len(ex) else []})
    doc = {"source": source, "rows": int(len(assign)), "K": K, "descriptive": True,
           "rule": f"a property passes when its permutation p < {ALPHA} / {max(len(align), 1)} (Bonferroni, "
                   f"{N_PERMUTATIONS} shuffles of the {source} among rows of equal {strata_name}: what z carries beyond x)"
                   + ("" if q is None else f" and the posterior q carries it (MI under q >= max({POSTERIOR_SHARE:g} "
                                           f"x the argmax's MI, {MIN_POSTERIOR_MI:g} nats))"),
           "properties": align.to_dict("records"), "values": values, "notes": notes}
    tidy = pd.concat([ngrams.assign(kind="ngram"), align.assign(kind="property")], ignore_index=True)
    return doc, tidy


#: a run folder's files (written after the final evaluation; ``write_latent_meaning``), named without torch
from zfree_lab.run.run_config import MEANING_FILE, MEANING_TABLE  # noqa: E402,F401


def tied_router_argmax(p: np.ndarray, tie: float = 1e-6) -> np.ndarray:
    """The router's argmax per row, (N, K) -> (N,), the lowest index among values within ``tie`` of the
    maximum (a uniform router is one stratum)."""
    p = np.asarray(p)
    return (p >= p.max(-1, keepdims=True) - tie).argmax(-1)


def write_latent_meaning(out, ev, pairs: Sequence[Pair], *, latent_kind: str, given: bool, tokenizer=None,
                         strategies: Sequence[str] | None = None, seed: int = 0,
                         use_threshold: float | None = None) -> float | None:
    """Write ``out/latent_meaning.json`` and ``.parquet`` (``latent_meaning``) for the final evaluation
    ``ev`` over ``pairs``: all three descriptions for a discrete posterior, the properties of the
    k-means clusters for a Gaussian one, nothing for a given z. When ``latent/measured_use_fraction``
    is not above ``use_threshold`` the document says z is unused (``decoder_uses_z`` false, a note).
    The null is stratified by the router's argmax where there is one. Returns the wall seconds (None:
    nothing written)."""
    import time
    from pathlib import Path

    from zfree.core.io import atomic_write_json, atomic_write_parquet

    if given or "posterior_argmax" not in ev.per_example:
        return None
    t0 = time.time()
    discrete = str(latent_kind) == "discrete"
    if discrete and ev.meaning is None:
        return None
    decode = (lambda ids: tokenizer.decode(ids)) if tokenizer is not None else None
    # the null conditions on z as read from x alone: the router's argmax where the model has one (a z that
    # follows x, as a collapsed posterior q ~ p does, then never moves inside a stratum), else x itself
    router = getattr(ev, "p", None) if discrete else None
    strata = tied_router_argmax(router) if router is not None else None
    doc, tidy = latent_meaning(ev.per_example["posterior_argmax"].to_numpy(), pairs, q=ev.q if discrete else None,
                               rows=ev.meaning if discrete else None, n_tokens=ev.per_example["n_tokens"].to_numpy(),
                               decode=decode, strategies=strategies, seed=seed, strata=strata,
                               strata_name="router argmax (z read from x alone)" if strata is not None else "x",
                               source="posterior argmax" if discrete else "k-means clusters of the posterior means")
    use = ev.metrics.get("latent/measured_use_fraction")
    if use_threshold is not None and use is not None and math.isfinite(use):
        doc["decoder_uses_z"] = bool(use > use_threshold)
        if not doc["decoder_uses_z"]:
            doc["notes"].insert(0, f"the decoder does not use z on these rows (measured use {use:.0%}, not above "
                                   f"{use_threshold:.0%}): what passes here describes the posterior q, not a change "
                                   "z makes in y")
    doc["wall_s"] = time.time() - t0
    atomic_write_parquet(Path(out) / MEANING_TABLE, tidy)
    atomic_write_json(Path(out) / MEANING_FILE, doc)
    return doc["wall_s"]
