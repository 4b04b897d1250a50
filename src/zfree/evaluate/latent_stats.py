"""What a latent encodes, from its assignments and decodes (Hungarian matching, the linear probe,
z-control decoding, the Gaussian latent's active units, the mutual information of either kind)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import pandas as pd
from scipy.optimize import linear_sum_assignment
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import normalized_mutual_info_score

from zfree.data.pairs import Pair
from zfree.data.synth import STRATEGIES, text_to_digits

if TYPE_CHECKING:  # type hints only: torch is imported where it is used (the report reads tables without it)
    import torch

    from zfree.data.batching import EncodedPair

ACTIVE_UNIT_THRESHOLD = 0.01  # Burda et al. 2016: a dimension is active if Var_x(E_q[z_d]) > 0.01


def confusion(per_example: pd.DataFrame, unambiguous_only: bool = True) -> pd.DataFrame:
    """Counts of posterior argmax (rows: latent value) against the true strategy (columns), on the
    rows where one strategy fits (m = 1) unless ``unambiguous_only`` is False."""
    df = per_example[per_example["n_consistent"] == 1] if unambiguous_only else per_example
    return pd.crosstab(df["posterior_argmax"], df["strategy"]).rename_axis(index="latent value", columns="strategy")


def matched_share(counts: np.ndarray, n_rows: int) -> float:
    """The best one-to-one matching of latent values (rows of ``counts``) to labels (columns),
    Hungarian algorithm on the counts: matched counts / (matched pairs * ``n_rows``)."""
    r, c = linear_sum_assignment(-counts)
    return float(sum(counts[i, j] for i, j in zip(r, c)) / (len(r) * n_rows))


def hungarian_accuracy(labels, assignment) -> float:
    """Accuracy of the best one-to-one matching of latent values to labels (Hungarian algorithm);
    values left unmatched (K > number of labels) count as errors. NaN on no rows."""
    if len(labels) == 0:
        return float("nan")
    ct = pd.crosstab(np.asarray(assignment), np.asarray(labels))
    r, c = linear_sum_assignment(-ct.to_numpy())
    return float(ct.to_numpy()[r, c].sum() / len(labels))


def probe_accuracy(features: np.ndarray, labels: np.ndarray, seed: int = 0) -> float:
    """Held-out accuracy of a logistic-regression probe of the strategy from the posterior features
    (rows, d) (first half of the rows train, second half test); NaN with fewer than 2 rows or classes."""
    n = len(labels) // 2
    if n < 2 or len(set(labels[:n])) < 2:
        return float("nan")
    clf = LogisticRegression(max_iter=500, random_state=seed)
    x = (features - features[:n].mean(0)) / (features[:n].std(0) + 1e-6)
    clf.fit(x[:n], labels[:n])
    return float(clf.score(x[n:], labels[n:]))


def greedy_decode(model, prefixes: Sequence[Sequence[int]], z: Sequence[int], *, eos_id: int,
                  max_new_tokens: int) -> list[list[int]]:
    """Greedy decoding of y by a discrete CVAE given each row's prefix and latent value; the generated
    ids per row, without the end token."""
    import torch  # lazy, as every torch use here: the report reads this module's tables without torch

    from zfree.models.decoding import decode_with_latents

    dev = next(model.parameters()).device
    with torch.no_grad():
        latents = model.latent_vectors(torch.as_tensor(list(z), device=dev))  # (N, D)
        return decode_with_latents(model.backbone, prefixes, latents, eos_id=eos_id, max_new_tokens=max_new_tokens)


def strategy_outputs(pairs: Sequence[Pair], strategies: Sequence[str]) -> list[list[str]]:
    """Per row, the text each strategy produces on its x (what a decode is compared with)."""
    return [[" ".join(map(str, STRATEGIES[s](text_to_digits(p.x)))) for s in strategies] for p in pairs]


def z_control_metrics(decode: Callable[[object], list[list[int]]], sampled, forced: Sequence | None,
                      encoded: Sequence[EncodedPair], pairs: Sequence[Pair], tokenizer,
                      strategies: Sequence[str]) -> dict[str, float]:
    """task/correctness: the share of rows whose decode with the ``sampled`` latents equals some
    strategy's output on x. structure/z_control_accuracy: decode with each latent of ``forced``
    (one per latent value or cluster) for every row, match latents to strategies (Hungarian on the
    counts, ``matched_share``) and report the share following the matched one (NaN without ``forced``).
    ``decode(latents)`` returns the generated ids per row of ``encoded``."""
    outputs_of = strategy_outputs(pairs, strategies)
    texts = [tokenizer.decode(d) for d in decode(sampled)]
    correct = [t.strip() in outs for t, outs in zip(texts, outputs_of)]
    res = {"task/correctness": float(np.mean(correct)), "structure/z_control_accuracy": float("nan")}
    if forced is not None:
        counts = np.zeros((len(forced), len(strategies)))
        for k, zk in enumerate(forced):
            counts[k] = np.array([[tokenizer.decode(d).strip() == o for o in outs]
                                  for d, outs in zip(decode(zk), outputs_of)]).sum(0)
        res["structure/z_control_accuracy"] = matched_share(counts, len(encoded))
    return res


def decode_metrics(model, encoded: Sequence[EncodedPair], pairs: Sequence[Pair], router: np.ndarray,
                   tokenizer, strategies: Sequence[str], seed: int = 0) -> dict[str, float]:
    """``z_control_metrics`` of a discrete CVAE: z drawn from the router (rows, K) with a generator
    seeded by ``seed``, then each of the K values forced."""
    rng = np.random.default_rng(seed)
    K = model.n_latent
    prefixes = [e.prefix_ids for e in encoded]
    max_new = max(len(e.target_ids) for e in encoded) + 2
    z = [int(rng.choice(K, p=r / r.sum())) for r in router]
    decode = lambda zs: greedy_decode(model, prefixes, zs, eos_id=tokenizer.eos_token_id,  # noqa: E731
                                      max_new_tokens=max_new)
    return z_control_metrics(decode, z, [[k] * len(prefixes) for k in range(K)], encoded, pairs, tokenizer, strategies)


def continuous_decode_metrics(model, encoded: Sequence[EncodedPair], pairs: Sequence[Pair], z_prior: torch.Tensor,
                              centroids: np.ndarray | None, tokenizer, strategies) -> dict[str, float]:
    """``z_control_metrics`` of a continuous CVAE: z drawn from the prior (rows, d_latent), then each
    k-means centroid (k, d_latent) forced (z_control_accuracy NaN without centroids)."""
    prefixes = [e.prefix_ids for e in encoded]
    max_new = max(len(e.target_ids) for e in encoded) + 2
    decode = lambda z: model.greedy_decode(prefixes, z, eos_id=tokenizer.eos_token_id,  # noqa: E731
                                           max_new_tokens=max_new)
    import torch  # lazy (``greedy_decode``)

    dtype = next(model.parameters()).dtype  # float32 (float64 in the fp64 reference mode)
    forced = None if centroids is None else [torch.as_tensor(c, dtype=dtype).expand(len(prefixes), -1)
                                             for c in centroids]
    return z_control_metrics(decode, z_prior.to(dtype), forced, encoded, pairs, tokenizer, strategies)


def active_units(posterior_mean: np.ndarray, threshold: float = ACTIVE_UNIT_THRESHOLD) -> int:
    """Number of latent dimensions whose posterior mean varies across examples, Var_i(mu_{i,d}) >
    ``threshold`` (Burda et al. 2016, "Importance Weighted Autoencoders", §5.2). (rows, d_latent) -> int."""
    return int((np.var(posterior_mean, axis=0) > threshold).sum())


def categorical_mutual_information(q: np.ndarray) -> float:
    """I(x,y; z) under the aggregated posterior of a discrete latent, exact: H(mean_i q_i) - mean_i H(q_i),
    nats; >= 0 by the concavity of H (clipped at 0: rounding alone can put it a few ulps below).
    ``q`` (rows, n_latent): each row's posterior probabilities -> float."""
    q_mean = q.mean(0)
    h_aggregate = float(-(q_mean * np.log(np.clip(q_mean, 1e-30, None))).sum())
    return max(0.0, h_aggregate - float(-(q * np.log(np.clip(q, 1e-30, None))).sum(-1).mean()))


def gaussian_mutual_information(mu: np.ndarray, logvar: np.ndarray, seed: int = 0) -> float:
    """I(x,y; z) under the aggregated posterior q(z) = (1/N) sum_j q(z | x_j, y_j), Monte Carlo with one
    z_i ~ q(z | x_i, y_i) per row: mean_i [log q(z_i | x_i, y_i) - log q(z_i)] (Hoffman & Johnson 2016;
    the estimator of He et al. 2019). Nats; bounded by log N. (rows, d_latent) each -> float."""
    import torch  # lazy (``greedy_decode``)

    m = torch.as_tensor(mu, dtype=torch.float64)
    lv = torch.as_tensor(logvar, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    z = m + torch.exp(0.5 * lv) * torch.randn(m.shape, generator=g, dtype=torch.float64)
    d = m.shape[1]
    log_q_own = -0.5 * (d * math.log(2 * math.pi) + lv.sum(-1) + (((z - m) ** 2) / lv.exp()).sum(-1))
    diff = z[:, None, :] - m[None, :, :]  # (N, N, d): z_i against component j
    log_q_all = -0.5 * (d * math.log(2 * math.pi) + lv.sum(-1)[None, :] + ((diff ** 2) / lv.exp()[None]).sum(-1))
    log_q_agg = torch.logsumexp(log_q_all, 1) - math.log(len(m))
    return float((log_q_own - log_q_agg).mean())


# ---------------------------------------------------------------------------- labels and samples


def label_keys(pairs: Sequence[Pair]) -> list[str]:
    """The ``labels`` keys present on at least one row, sorted."""
    return sorted({k for p in pairs for k in (p.labels or {})})


#: a label metric (NMI, Hungarian accuracy, probe) on fewer evaluated rows than this is flagged by
#: ``label_warnings``: the probe tests on half of them, and at ~50 rows a 3-value label's accuracy
#: moves by 2 points a row
MIN_LABEL_ROWS = 50


def label_structure_metrics(df: pd.DataFrame, features: np.ndarray, assignment: np.ndarray | None, seed: int = 0,
                            n_clusters_of=None) -> dict[str, float]:
    """Per label column ``label/<key>`` of ``df`` (rows holding it): structure/alignment_nmi/<key>,
    structure/hungarian_accuracy/<key>, structure/probe_accuracy/<key> (of ``features`` (rows, d)), and
    what they rest on: structure/n_rows/<key>, structure/n_values/<key> and
    structure/majority_baseline/<key> (the share of its most frequent value). ``assignment`` (rows,):
    the latent value per row; None: ``n_clusters_of(key, rows, k)`` gives one per label (the Gaussian
    latent's k-means), else NMI and Hungarian accuracy are NaN. A label of one value gets NaN for all
    three (``label_warnings`` says why)."""
    out: dict[str, float] = {}
    nan = float("nan")
    for col in [c for c in df.columns if c.startswith("label/")]:
        key = col[len("label/"):]
        have = df[col].notna().to_numpy()
        lab = df.loc[have, col].astype(str).to_numpy()
        counts = pd.Series(lab).value_counts()
        out[f"structure/n_rows/{key}"] = float(len(lab))
        out[f"structure/n_values/{key}"] = float(len(counts))
        out[f"structure/majority_baseline/{key}"] = float(counts.iloc[0] / len(lab)) if len(lab) else nan
        if len(counts) < 2:  # constant (or absent) on these rows: nothing to align, match or probe
            z = None
        elif assignment is not None:
            z = np.asarray(assignment)[have]
        else:
            z = None if n_clusters_of is None else n_clusters_of(key, have, len(counts))
        out[f"structure/alignment_nmi/{key}"] = float(normalized_mutual_info_score(lab, z)) if z is not None else nan
        out[f"structure/hungarian_accuracy/{key}"] = hungarian_accuracy(lab, z) if z is not None else nan
        out[f"structure/probe_accuracy/{key}"] = probe_accuracy(features[have], lab, seed=seed) if len(counts) >= 2 \
            else nan
    return out


def label_warnings(metrics) -> list[str]:
    """Visible warnings for the label metrics of one run's ``metrics`` (a dict or a summary row
    holding ``label_structure_metrics``' keys): a label with one value on the evaluated rows (its
    NMI, Hungarian and probe accuracy are NaN) and a label on fewer than ``MIN_LABEL_ROWS`` rows
    (its metrics rest on few rows). [] when every label is on enough rows with >= 2 values."""
    out = []
    for k in sorted(k for k in metrics.keys() if str(k).startswith("structure/n_rows/")):
        key = k[len("structure/n_rows/"):]
        n, v = metrics[k], metrics.get(f"structure/n_values/{key}", float("nan"))
        if not np.isfinite(n):  # a summary row of a run evaluated before these keys existed
            continue
        if not (v >= 2):
            out.append(f"label '{key}': one value on the {n:.0f} evaluated rows: its NMI, Hungarian and probe "
                       "accuracy are NaN (a constant label carries no information)")
        elif n < MIN_LABEL_ROWS:
            out.append(f"label '{key}': on {n:.0f} evaluated rows only (< {MIN_LABEL_ROWS}): its NMI, Hungarian and "
                       "probe accuracy rest on few rows")
    return out


def label_confusion(per_example: pd.DataFrame, key: str) -> pd.DataFrame:
    """Counts of posterior argmax (rows: latent value) against the label ``key`` (columns), on the
    rows holding it (the m = 1 confusion of the synthetic benchmark, for a general label)."""
    df = per_example[per_example[f"label/{key}"].notna()]
    return pd.crosstab(df["posterior_argmax"], df[f"label/{key}"]).rename_axis(index="latent value", columns=key)


#: distinct validation x whose y under every latent value are decoded (``latent_samples``)
SAMPLE_X = 3


def latent_samples(model, encoded: Sequence[EncodedPair], pairs: Sequence[Pair], tokenizer, *, n_x: int = SAMPLE_X,
                   seed: int = 0) -> pd.DataFrame:
    """For the first ``n_x`` distinct x of ``pairs``, the greedy and one sampled (temperature 1,
    generator seeded by ``seed``) y of a discrete CVAE under each latent value k = 0..K-1. Returns a
    DataFrame: id, x, reference (the row's y), latent, greedy, sampled (one row per x and k)."""
    import torch  # lazy (``greedy_decode``)

    from zfree.models.decoding import decode_with_latents

    idx = first_distinct_x(pairs, n_x)
    if not idx:
        return pd.DataFrame(columns=["id", "x", "reference", "latent", "greedy", "sampled"])
    K = model.n_latent
    dev = next(model.parameters()).device
    cells = [(k, i) for k in range(K) for i in idx]
    prefixes = [encoded[i].prefix_ids for _, i in cells]
    lat = model.latent_vectors(torch.tensor([k for k, _ in cells], device=dev))
    kw = dict(eos_id=tokenizer.eos_token_id, max_new_tokens=max(len(encoded[i].target_ids) for i in idx) + 8)
    greedy = decode_with_latents(model.backbone, prefixes, lat, **kw)
    sampled = decode_with_latents(model.backbone, prefixes, lat, generator=torch.Generator().manual_seed(seed), **kw)
    rows = [{"id": pairs[i].id, "x": pairs[i].x, "reference": pairs[i].y, "latent": k,
             "greedy": tokenizer.decode(g).strip(), "sampled": tokenizer.decode(d).strip()}
            for (k, i), g, d in zip(cells, greedy, sampled)]
    return pd.DataFrame(rows).sort_values(["id", "latent"], kind="stable").reset_index(drop=True)


def first_distinct_x(pairs: Sequence[Pair], n_x: int) -> list[int]:
    """Indices of the first row of each of the first ``n_x`` distinct x of ``pairs``, in order."""
    first: dict[str, int] = {}
    for i, p in enumerate(pairs):
        if len(first) >= n_x:
            break
        first.setdefault(p.x, i)
    return list(first.values())


MULTIREF_COLUMNS = ["id", "x", "kind", "index", "output", "references"]


def multiref_outputs(model, encoded: Sequence[EncodedPair], pairs: Sequence[Pair], tokenizer,
                     references: dict[str, list[str]], *, n_x: int, n_samples: int, seed: int = 0) -> pd.DataFrame:
    """Several outputs per MR for ``zfree.evaluate.multiref``, for the first ``n_x`` distinct x of
    ``pairs``: with K >= 2 values the greedy y under each value (kind "greedy", index k); with K = 1
    (the z-free control) ``n_samples`` samples at temperature 1, seeded by ``seed`` (kind "sampled").
    ``references``: x -> its human references (else the row's own y). Outputs are cut at
    ``max(|y|) + 8`` tokens. Returns a DataFrame with ``MULTIREF_COLUMNS``, one row per MR and output."""
    import torch  # lazy (``greedy_decode``)

    from zfree.models.decoding import decode_with_latents

    idx = first_distinct_x(pairs, n_x)
    if not idx:
        return pd.DataFrame(columns=MULTIREF_COLUMNS)
    K = model.n_latent
    kind, n_out = ("greedy", K) if K >= 2 else ("sampled", n_samples)
    dev = next(model.parameters()).device
    rows = [i for i in idx for _ in range(n_out)]  # MR-major: (MR, output) pairs
    z = torch.tensor([j if kind == "greedy" else 0 for _ in idx for j in range(n_out)], device=dev)
    gen = torch.Generator().manual_seed(seed) if kind == "sampled" else None
    ids = decode_with_latents(model.backbone, [encoded[i].prefix_ids for i in rows], model.latent_vectors(z),
                              eos_id=tokenizer.eos_token_id, generator=gen,
                              max_new_tokens=max(len(encoded[i].target_ids) for i in idx) + 8)
    out = [{"id": pairs[i].id, "x": pairs[i].x, "kind": kind, "index": r % n_out,
            "output": tokenizer.decode(d).strip(), "references": list(references.get(pairs[i].x, [pairs[i].y]))}
           for r, (i, d) in enumerate(zip(rows, ids))]
    return pd.DataFrame(out, columns=MULTIREF_COLUMNS)
