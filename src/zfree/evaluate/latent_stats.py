"""What a latent encodes, from its assignments and decodes: Hungarian matching, the linear probe,
z-control decoding, and the Gaussian latent's active units and mutual information.
``zfree.evaluate.metrics`` calls these (and re-exports them)."""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch
from scipy.optimize import linear_sum_assignment
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import normalized_mutual_info_score

from zfree.data.batching import EncodedPair
from zfree.data.pairs import Pair
from zfree.data.synth import STRATEGIES, text_to_digits
from zfree.models.base import greedy_decode_with_latents
from zfree.models.head import exact_logits_from_hidden

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


@torch.no_grad()
def greedy_decode(model, prefixes: Sequence[Sequence[int]], z: Sequence[int], *, eos_id: int,
                  max_new_tokens: int) -> list[list[int]]:
    """Greedy decoding of y by a discrete CVAE given the prefix and a latent value per row; rows are
    grouped by prefix length so no padding is needed. Returns the generated ids without the end token."""
    dev = next(model.parameters()).device
    latents = model.latent_embedding(torch.as_tensor(list(z), device=dev))  # (N, D)
    return greedy_decode_with_latents(model.backbone, prefixes, latents, eos_id=eos_id, max_new_tokens=max_new_tokens)


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
    dtype = next(model.parameters()).dtype  # float32 (float64 in the fp64 reference mode)
    forced = None if centroids is None else [torch.as_tensor(c, dtype=dtype).expand(len(prefixes), -1)
                                             for c in centroids]
    return z_control_metrics(decode, z_prior.to(dtype), forced, encoded, pairs, tokenizer, strategies)


def active_units(posterior_mean: np.ndarray, threshold: float = ACTIVE_UNIT_THRESHOLD) -> int:
    """Number of latent dimensions whose posterior mean varies across examples, Var_i(mu_{i,d}) >
    ``threshold`` (Burda et al. 2016, "Importance Weighted Autoencoders", §5.2). (rows, d_latent) -> int."""
    return int((np.var(posterior_mean, axis=0) > threshold).sum())


def gaussian_mutual_information(mu: np.ndarray, logvar: np.ndarray, seed: int = 0) -> float:
    """I(x,y; z) under the aggregated posterior q(z) = (1/N) sum_j q(z | x_j, y_j), Monte Carlo with one
    z_i ~ q(z | x_i, y_i) per row: mean_i [log q(z_i | x_i, y_i) - log q(z_i)] (Hoffman & Johnson 2016;
    the estimator of He et al. 2019). Nats; bounded by log N. (rows, d_latent) each -> float."""
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


def label_structure_metrics(df: pd.DataFrame, features: np.ndarray, assignment: np.ndarray | None, seed: int = 0,
                            n_clusters_of=None) -> dict[str, float]:
    """Per label column ``label/<key>`` of ``df`` (rows without it left out): structure/alignment_nmi/<key>,
    structure/hungarian_accuracy/<key> (all rows holding the label; "m = 1" is a synthetic notion) and
    structure/probe_accuracy/<key> (``probe_accuracy`` of ``features`` (rows, d)). ``assignment``
    (rows,) is the latent value per row; None: ``n_clusters_of(key, rows) -> assignment`` is asked per
    label (the Gaussian latent's k-means) or, without it, NMI and Hungarian accuracy are NaN."""
    out: dict[str, float] = {}
    for col in [c for c in df.columns if c.startswith("label/")]:
        key = col[len("label/"):]
        have = df[col].notna().to_numpy()
        lab = df.loc[have, col].astype(str).to_numpy()
        if assignment is not None:
            z = np.asarray(assignment)[have]
        elif n_clusters_of is not None:
            z = n_clusters_of(key, have, len(set(lab)))
        else:
            z = None
        nan = float("nan")
        out[f"structure/alignment_nmi/{key}"] = float(normalized_mutual_info_score(lab, z)) if z is not None else nan
        out[f"structure/hungarian_accuracy/{key}"] = hungarian_accuracy(lab, z) if z is not None else nan
        out[f"structure/probe_accuracy/{key}"] = probe_accuracy(features[have], lab, seed=seed)
    return out


def label_confusion(per_example: pd.DataFrame, key: str) -> pd.DataFrame:
    """Counts of posterior argmax (rows: latent value) against the label ``key`` (columns), on the
    rows holding it (the m = 1 confusion of the synthetic benchmark, for a general label)."""
    df = per_example[per_example[f"label/{key}"].notna()]
    return pd.crosstab(df["posterior_argmax"], df[f"label/{key}"]).rename_axis(index="latent value", columns=key)


@torch.no_grad()
def sample_decode_with_latents(backbone, prefixes, latents: torch.Tensor, *, eos_id: int, max_new_tokens: int,
                               generator: torch.Generator) -> list[list[int]]:
    """As ``zfree.models.base.greedy_decode_with_latents`` but each next token drawn from the model's
    softmax (temperature 1) with ``generator`` (CPU). prefixes: list of id lists; latents (rows, d_model)."""
    dev = latents.device
    emb_layer = backbone.get_input_embeddings()
    out = []
    for r, p in enumerate(prefixes):
        ids = torch.tensor([list(p)], device=dev)
        P = len(p)
        for _ in range(max_new_tokens):
            inj = (torch.arange(ids.shape[1], device=dev) >= P - 1).to(latents.dtype)
            emb = emb_layer(ids) + inj[None, :, None] * latents[r][None, None, :]
            h = backbone.base_model(inputs_embeds=emb, use_cache=False).last_hidden_state[:, -1]
            probs = torch.softmax(exact_logits_from_hidden(backbone, h), -1).cpu()  # float32 (float64 model: float64)
            nxt = int(torch.multinomial(probs[0], 1, generator=generator))
            ids = torch.cat([ids, torch.tensor([[nxt]], device=dev)], 1)
            if nxt == eos_id:
                break
        gen = ids[0, P:].tolist()
        out.append(gen[: gen.index(eos_id)] if eos_id in gen else gen)
    return out


#: distinct validation x whose y under every latent value are decoded (``latent_samples``)
SAMPLE_X = 3


def latent_samples(model, encoded: Sequence[EncodedPair], pairs: Sequence[Pair], tokenizer, *, n_x: int = SAMPLE_X,
                   seed: int = 0) -> pd.DataFrame:
    """For the first ``n_x`` distinct x of ``pairs``, the greedy and one sampled (temperature 1,
    generator seeded by ``seed``) y of a discrete CVAE under each latent value k = 0..K-1, side by side.
    Returns a DataFrame: id, x, reference (the row's y), latent, greedy, sampled (one row per x and k)."""
    first: dict[str, int] = {}
    for i, p in enumerate(pairs):
        if p.x not in first and len(first) < n_x:
            first[p.x] = i
    idx = list(first.values())
    if not idx:
        return pd.DataFrame(columns=["id", "x", "reference", "latent", "greedy", "sampled"])
    K = model.n_latent
    dev = next(model.parameters()).device
    prefixes = [encoded[i].prefix_ids for i in idx]
    max_new = max(len(encoded[i].target_ids) for i in idx) + 8
    g = torch.Generator().manual_seed(seed)
    rows = []
    for k in range(K):
        lat = model.latent_embedding(torch.full((len(idx),), k, device=dev))
        greedy = greedy_decode_with_latents(model.backbone, prefixes, lat, eos_id=tokenizer.eos_token_id,
                                            max_new_tokens=max_new)
        sampled = sample_decode_with_latents(model.backbone, prefixes, lat, eos_id=tokenizer.eos_token_id,
                                             max_new_tokens=max_new, generator=g)
        for j, i in enumerate(idx):
            rows.append({"id": pairs[i].id, "x": pairs[i].x, "reference": pairs[i].y, "latent": k,
                         "greedy": tokenizer.decode(greedy[j]).strip(), "sampled": tokenizer.decode(sampled[j]).strip()})
    return pd.DataFrame(rows).sort_values(["id", "latent"], kind="stable").reset_index(drop=True)
