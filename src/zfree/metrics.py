"""What z explains: evaluation of a CVAE on the validation rows (DESIGN §5 metric keys).

rho_recon = R_val / c_base is a ratio of means (seed 000, "Interpretation"); the per-example
rho_i = lbar_i / b_i is a mean of ratios and is only ever reported under its own name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from scipy.optimize import linear_sum_assignment
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import normalized_mutual_info_score

from zfree.config import ObjectiveConfig
from zfree.data.batching import EncodedPair, collate
from zfree.data.pairs import Pair
from zfree.data.synth import STRATEGIES, text_to_digits
from zfree.losses import (assemble_objective, inter_latent_jsd, masked_mean_token_nll, token_weights,
                          weighted_mean_token_nll)
from zfree.losses import assemble_gaussian_objective
from zfree.models.continuous import ContinuousCVAE
from zfree.models.base import greedy_decode_with_latents
from zfree.models.discrete import DiscreteCVAE
from zfree.theory import predicted_use

CODE_USED_FRACTION = 0.01  # a latent value counts as used if it is the posterior argmax of >= 1% of rows


@dataclass
class Evaluation:
    metrics: dict[str, float]
    per_example: pd.DataFrame


def _batches(encoded: Sequence[EncodedPair], size: int, pad_id: int):
    for i in range(0, len(encoded), size):
        yield i, collate(encoded[i : i + size], pad_id=pad_id)


def _reconstruction_per_latent(tok_nll, nll, batch, objective: ObjectiveConfig, base_token_nll: dict | None):
    """The reconstruction term per latent value or sample (B, n): the plain per-token mean ``nll``,
    or under ``token`` weighting the base-surprisal-share weighted mean (``losses.token_weights``)."""
    if objective.weighting != "token" or base_token_nll is None:
        return nll
    bt = torch.zeros_like(batch.target_mask, dtype=torch.float32)
    for r, rid in enumerate(batch.ids):
        s = base_token_nll[rid]
        bt[r, batch.prefix_len[r] : batch.prefix_len[r] + len(s)] = torch.as_tensor(s, dtype=torch.float32)
    return weighted_mean_token_nll(tok_nll, batch.target_mask, token_weights(bt, batch.target_mask, objective.token_alpha))


def _per_example_columns(df: pd.DataFrame, pairs: Sequence[Pair], b: np.ndarray) -> np.ndarray:
    """Adds strategy, b, rho_i, bayes_nll, n_consistent and predicted_use to ``df`` in place;
    returns the per-row Bayes NLL (nats per sequence; NaN where unknown)."""
    df.insert(1, "strategy", [p.strategy for p in pairs])
    df["b"] = b
    df["rho_i"] = df["lbar"] / df["b"]
    bayes = np.array([np.nan if p.bayes_nll is None else p.bayes_nll for p in pairs], float)
    df["bayes_nll"] = bayes
    df["n_consistent"] = [p.n_consistent for p in pairs]
    known = bool(np.isfinite(bayes).all())
    excess_seq = df["n_tokens"] * df["b"] - bayes
    df["predicted_use"] = predicted_use(df["beta_eff"].to_numpy(), bayes if known else None,
                                        excess_seq.to_numpy() if known else None)
    return bayes


def _loss_metrics(df: pd.DataFrame, fr: list[dict], c_base: float, step: int) -> dict[str, float]:
    """loss/val/* (R, rho_recon, KL, the beta = 1 unweighted ELBO per sequence and per token) and
    loss_contrib/fraction_abs/* from the per-example table and the per-batch contributions."""
    contrib = {k: float(np.mean([f[k] for f in fr])) for k in fr[0]}
    tot_abs = sum(abs(v) for v in contrib.values()) or 1.0
    R = float(df["lbar"].mean())
    nelbo = df["n_tokens"] * df["lbar"] + df["kl"]
    return {
        "step": step,
        "loss/val/reconstruction_loss": R,
        "loss/val/baseline_normalized_reconstruction_loss": R / c_base,
        "loss/val/kl_prior_loss": float(df["kl"].mean()),
        "loss/val/zfree_reconstruction_loss": float(df["zfree_nll"].mean()),
        "loss/val/neg_elbo_nats_per_sequence": float(nelbo.mean()),
        "loss/val/neg_elbo_nats_per_token": float((nelbo / df["n_tokens"]).mean()),
        "loss/val/mean_rho_i": float(df["rho_i"].mean()),
        "loss/val/objective": sum(contrib.values()),
        **{f"loss_contrib/fraction_abs/{k}": abs(v) / tot_abs for k, v in contrib.items()},
    }


def _objective_metrics(df: pd.DataFrame, c_base: float, objective: ObjectiveConfig) -> dict[str, float]:
    return {
        "reference/c_base": c_base,
        "objective/beta": float(objective.beta),
        "objective/recon_weight_mean": float(df["weight"].mean()),
        "objective/recon_weight_max": float(df["weight"].max()),
        "objective/beta_eff_median": float(df["beta_eff"].median()),
    }


def _structure_metrics(df: pd.DataFrame, features: np.ndarray, seed: int, assigned: bool = True) -> dict[str, float]:
    """structure/alignment_nmi (all rows and m = 1 rows), Hungarian accuracy on m = 1 rows and the
    held-out probe of ``features``; all NaN when any strategy label is missing or no latent
    assignment exists (``assigned=False``), never faked."""
    labels = df["strategy"]
    if not (assigned and labels.notna().all()):
        return {k: float("nan") for k in ("structure/alignment_nmi", "structure/alignment_nmi_unambiguous",
                                          "structure/probe_accuracy", "structure/hungarian_accuracy_unambiguous")}
    un = df["n_consistent"] == 1
    z = df["posterior_argmax"]
    return {
        "structure/alignment_nmi": float(normalized_mutual_info_score(labels, z)),
        "structure/alignment_nmi_unambiguous": float(normalized_mutual_info_score(labels[un], z[un])) if un.any()
        else float("nan"),
        "structure/hungarian_accuracy_unambiguous": hungarian_accuracy(labels[un], z[un]),
        "structure/probe_accuracy": probe_accuracy(features, labels.to_numpy(), seed=seed),
    }


@torch.no_grad()
def evaluate(model: DiscreteCVAE | ContinuousCVAE, encoded: Sequence[EncodedPair], pairs: Sequence[Pair], *, b: np.ndarray,
             c_base: float, objective: ObjectiveConfig, step: int, pad_id: int, tokenizer=None,
             strategies: Sequence[str] | None = None, decode_rows: int = 0, batch_size: int = 128,
             base_token_nll: dict | None = None, seed: int = 0) -> Evaluation:
    """Evaluate on validation rows. ``b`` (n_rows,) is the frozen base surprisal (nats per token).

    Returns DESIGN §5 keys: loss/val/*, loss_contrib/fraction_abs/*, structure/*, latent/*,
    task/correctness, reference/c_base, objective/*. Metrics that need strategy labels are NaN
    (with a note in ``notes``) when labels are missing, never faked.
    """
    if isinstance(model, ContinuousCVAE):
        return evaluate_continuous(model, encoded, pairs, b=b, c_base=c_base, objective=objective, step=step,
                                   pad_id=pad_id, tokenizer=tokenizer, strategies=strategies, decode_rows=decode_rows,
                                   batch_size=batch_size, base_token_nll=base_token_nll, seed=seed)
    was_training = model.training
    model.eval()
    dev = next(model.parameters()).device
    K = model.n_latent
    rows = []
    feats, q_all, p_all, fr = [], [], [], []
    for i, batch in _batches(encoded, batch_size, pad_id):
        batch = batch.to(dev)
        out = model(batch, with_distributions=True)
        tok_nll = -out.target_logprobs  # (B, K, T)
        nll_k = masked_mean_token_nll(tok_nll, batch.target_mask)  # (B, K) plain per-token means
        bb = torch.as_tensor(b[i : i + len(batch)], dtype=torch.float32, device=dev)
        recon = _reconstruction_per_latent(tok_nll, nll_k, batch, objective, base_token_nll)
        p_w = torch.softmax(out.prior_logits, -1)
        jsd = inter_latent_jsd(out.next_token_logprobs, p_w, out.pos_mask)
        br = assemble_objective(objective, recon_per_latent=recon,
                                q_logits=None if model.posterior_head is None else out.posterior_logits,
                                p_logits=out.prior_logits, target_len=batch.target_len, step=step, c_base=c_base,
                                b=bb, jsd=jsd)
        q = torch.softmax(br.per_example["q_logits"], -1)
        lbar = (q * nll_k).sum(-1)
        rows.append(pd.DataFrame({
            "id": batch.ids, "n_tokens": batch.target_len.cpu().numpy(), "lbar": lbar.cpu().numpy(),
            "kl": br.per_example["kl"].cpu().numpy(), "beta_eff": br.beta_eff.cpu().numpy(),
            "weight": br.recon_weight.cpu().numpy(), "posterior_argmax": q.argmax(-1).cpu().numpy(),
            "q_max": q.max(-1).values.cpu().numpy(), "oracle_nll": nll_k.min(-1).values.cpu().numpy(),
            "oracle_latent": nll_k.argmin(-1).cpu().numpy(), "decoder_jsd": jsd.cpu().numpy(),
            "zfree_nll": masked_mean_token_nll(-out.zfree_target_logprobs, batch.target_mask).cpu().numpy(),
        }))
        feats.append(out.features.cpu().numpy())
        q_all.append(q.cpu().numpy())
        p_all.append(torch.softmax(out.prior_logits, -1).cpu().numpy())
        fr.append({k: float(v) for k, v in br.contributions.items()})
    df = pd.concat(rows, ignore_index=True)
    bayes = _per_example_columns(df, pairs, b)
    df["measured_use"] = (df["kl"] >= 0.5 * np.where(np.isfinite(bayes), bayes, math.log(K))) & (df["kl"] > 1e-3)

    q_mean = np.concatenate(q_all).mean(0)
    usage = np.bincount(df["posterior_argmax"], minlength=K) / len(df)
    m: dict[str, float] = {
        **_loss_metrics(df, fr, c_base, step),
        "latent/oracle_rho": float(df["oracle_nll"].mean()) / c_base,
        "latent/q_max_mean": float(df["q_max"].mean()),
        "latent/codes_used": int((usage >= CODE_USED_FRACTION).sum()),
        "latent/usage_entropy": float(-(q_mean * np.log(np.clip(q_mean, 1e-30, None))).sum()),
        "latent/max_usage": float(usage.max()),
        **{f"latent/usage/{k}": float(u) for k, u in enumerate(usage)},  # share of rows whose argmax is k
        "latent/decoder_jsd": float(df["decoder_jsd"].mean()),
        "latent/measured_use_fraction": float(df["measured_use"].mean()),
        "latent/predicted_use_fraction": float(df["predicted_use"].mean()),
        **_objective_metrics(df, c_base, objective),
    }
    # mutual information of the aggregated posterior, exact for a discrete latent: H(mean q) - mean H(q)
    qa = np.concatenate(q_all)
    m["latent/mutual_information"] = m["latent/usage_entropy"] - float(
        -(qa * np.log(np.clip(qa, 1e-30, None))).sum(-1).mean())
    m.update(_structure_metrics(df, np.concatenate(feats), seed))
    if decode_rows and tokenizer is not None and strategies is not None:
        n = min(decode_rows, len(encoded))
        m.update(decode_metrics(model, encoded[:n], pairs[:n], np.concatenate(p_all)[:n], tokenizer, strategies,
                                seed=seed))
    if was_training:
        model.train()
    return Evaluation(m, df)


def confusion(per_example: pd.DataFrame, unambiguous_only: bool = True) -> pd.DataFrame:
    """Counts of posterior argmax (rows: latent value) against the true strategy (columns), on the
    rows where one strategy fits (m = 1) unless ``unambiguous_only`` is False."""
    df = per_example[per_example["n_consistent"] == 1] if unambiguous_only else per_example
    return pd.crosstab(df["posterior_argmax"], df["strategy"]).rename_axis(index="latent value", columns="strategy")


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
    (first half of the rows train, second half test)."""
    n = len(labels) // 2
    if n < 2 or len(set(labels[:n])) < 2:
        return float("nan")
    clf = LogisticRegression(max_iter=500, random_state=seed)
    x = (features - features[:n].mean(0)) / (features[:n].std(0) + 1e-6)
    clf.fit(x[:n], labels[:n])
    return float(clf.score(x[n:], labels[n:]))


@torch.no_grad()
def greedy_decode(model: DiscreteCVAE, prefixes: Sequence[Sequence[int]], z: Sequence[int], *, eos_id: int,
                  max_new_tokens: int) -> list[list[int]]:
    """Greedy decoding of y given the prefix and a latent value per row; rows are grouped by
    prefix length so no padding is needed. Returns the generated ids without the end token."""
    dev = next(model.parameters()).device
    latents = model.latent_embedding(torch.as_tensor(list(z), device=dev))  # (N, D)
    return greedy_decode_with_latents(model.backbone, prefixes, latents, eos_id=eos_id, max_new_tokens=max_new_tokens)


def decode_metrics(model: DiscreteCVAE, encoded: Sequence[EncodedPair], pairs: Sequence[Pair], router: np.ndarray,
                   tokenizer, strategies: Sequence[str], seed: int = 0) -> dict[str, float]:
    """task/correctness: greedy decoding with z drawn from the router; fraction of rows whose output
    equals some strategy's output on x. structure/z_control_accuracy: decode with each z forced, match
    latent values to strategies (Hungarian, on counts) and report the fraction following the matched one."""
    rng = np.random.default_rng(seed)
    K = model.n_latent
    prefixes = [e.prefix_ids for e in encoded]
    max_new = max(len(e.target_ids) for e in encoded) + 2
    eos = tokenizer.eos_token_id
    outputs_of = []
    for p in pairs:
        x = text_to_digits(p.x)
        outputs_of.append([" ".join(map(str, STRATEGIES[s](x))) for s in strategies])
    z = [int(rng.choice(K, p=r / r.sum())) for r in router]
    dec = greedy_decode(model, prefixes, z, eos_id=eos, max_new_tokens=max_new)
    texts = [tokenizer.decode(d) for d in dec]
    correct = [t.strip() in outs for t, outs in zip(texts, outputs_of)]
    counts = np.zeros((K, len(strategies)))
    follows = []
    for k in range(K):
        dk = greedy_decode(model, prefixes, [k] * len(prefixes), eos_id=eos, max_new_tokens=max_new)
        fk = np.array([[tokenizer.decode(d).strip() == o for o in outs] for d, outs in zip(dk, outputs_of)])
        counts[k] = fk.sum(0)
        follows.append(fk)
    r, c = linear_sum_assignment(-counts)
    acc = sum(counts[i, j] for i, j in zip(r, c)) / (len(r) * len(prefixes))
    return {"task/correctness": float(np.mean(correct)), "structure/z_control_accuracy": float(acc)}


# ---------------------------------------------------------------------------- continuous latent

ACTIVE_UNIT_THRESHOLD = 0.01  # Burda et al. 2016: a dimension is active if Var_x(E_q[z_d]) > 0.01


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


@torch.no_grad()
def evaluate_continuous(model: ContinuousCVAE, encoded: Sequence[EncodedPair], pairs: Sequence[Pair], *,
                        b: np.ndarray, c_base: float, objective: ObjectiveConfig, step: int, pad_id: int,
                        tokenizer=None, strategies: Sequence[str] | None = None, decode_rows: int = 0,
                        batch_size: int = 128, base_token_nll: dict | None = None, seed: int = 0) -> Evaluation:
    """Evaluate a continuous CVAE on validation rows; same arguments and keys as ``evaluate`` where
    they are defined. lbar is the Monte Carlo mean over ``model.n_samples`` posterior samples drawn
    with a generator seeded by ``seed`` (reproducible; torch's global generator is left alone).

    Differences from the discrete keys: ``posterior_argmax`` is the k-means cluster of the posterior
    means (k = the number of strategies), and structure/alignment_nmi, Hungarian accuracy and
    z_control_accuracy (decoding with each cluster centroid forced) use those clusters;
    structure/probe_accuracy reads the posterior means; task/correctness decodes with z drawn from
    the prior p(z|x). latent/active_units (Burda et al. 2016) and latent/mutual_information (Monte
    Carlo) are added. Keys that need a finite set of latent values (latent/oracle_rho,
    latent/q_max_mean, latent/codes_used, latent/usage_entropy, latent/max_usage,
    latent/decoder_jsd) are NaN: not defined for a Gaussian latent, not faked.
    """
    from sklearn.cluster import KMeans

    was_training = model.training
    model.eval()
    dev = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    rows, mus, logvars, prior_mus, prior_logvars, fr = [], [], [], [], [], []
    for i, batch in _batches(encoded, batch_size, pad_id):
        batch = batch.to(dev)
        out = model(batch, generator=gen)
        tok_nll = -out.target_logprobs  # (B, S, T)
        nll_s = masked_mean_token_nll(tok_nll, batch.target_mask)  # (B, S) plain per-token means
        bb = torch.as_tensor(b[i : i + len(batch)], dtype=torch.float32, device=dev)
        recon = _reconstruction_per_latent(tok_nll, nll_s, batch, objective, base_token_nll)
        learned = model.prior == "learned"
        br = assemble_gaussian_objective(objective, recon_per_sample=recon, mu_q=out.posterior_mean,
                                         logvar_q=out.posterior_logvar, mu_p=out.prior_mean if learned else None,
                                         logvar_p=out.prior_logvar if learned else None, target_len=batch.target_len,
                                         step=step, c_base=c_base, b=bb)
        rows.append(pd.DataFrame({
            "id": batch.ids, "n_tokens": batch.target_len.cpu().numpy(), "lbar": nll_s.mean(-1).cpu().numpy(),
            "kl": br.per_example["kl"].cpu().numpy(), "beta_eff": br.beta_eff.cpu().numpy(),
            "weight": br.recon_weight.cpu().numpy(),
            "posterior_sigma_mean": torch.exp(0.5 * out.posterior_logvar).mean(-1).cpu().numpy(),
            "zfree_nll": masked_mean_token_nll(-out.zfree_target_logprobs, batch.target_mask).cpu().numpy(),
        }))
        mus.append(out.posterior_mean.cpu().numpy())
        logvars.append(out.posterior_logvar.cpu().numpy())
        prior_mus.append(out.prior_mean.cpu().numpy())
        prior_logvars.append(out.prior_logvar.cpu().numpy())
        fr.append({k: float(v) for k, v in br.contributions.items()})
    df = pd.concat(rows, ignore_index=True)
    mu, logvar = np.concatenate(mus), np.concatenate(logvars)
    bayes = _per_example_columns(df, pairs, b)
    labels = df["strategy"]
    names = list(strategies) if strategies else sorted(set(labels.dropna()))
    n_clusters = min(len(names), len(df))
    centroids = None
    if n_clusters >= 2:
        km = KMeans(n_clusters=n_clusters, n_init=10, random_state=seed).fit(mu)
        df["posterior_argmax"], centroids = km.labels_, km.cluster_centers_
    else:
        df["posterior_argmax"] = 0
    fallback = math.log(max(n_clusters, 2))
    df["measured_use"] = (df["kl"] >= 0.5 * np.where(np.isfinite(bayes), bayes, fallback)) & (df["kl"] > 1e-3)

    nan = float("nan")
    m: dict[str, float] = {
        **_loss_metrics(df, fr, c_base, step),
        "latent/oracle_rho": nan, "latent/q_max_mean": nan, "latent/codes_used": nan, "latent/usage_entropy": nan,
        "latent/max_usage": nan, "latent/decoder_jsd": nan,
        "latent/active_units": active_units(mu),
        "latent/mutual_information": gaussian_mutual_information(mu, logvar, seed=seed),
        "latent/posterior_sigma_mean": float(df["posterior_sigma_mean"].mean()),
        "latent/measured_use_fraction": float(df["measured_use"].mean()),
        "latent/predicted_use_fraction": float(df["predicted_use"].mean()),
        **_objective_metrics(df, c_base, objective),
    }
    m.update(_structure_metrics(df, mu, seed, assigned=centroids is not None))
    if decode_rows and tokenizer is not None and strategies is not None:
        n = min(decode_rows, len(encoded))
        g = torch.Generator().manual_seed(seed + 1)
        mp, lvp = torch.as_tensor(np.concatenate(prior_mus)[:n]), torch.as_tensor(np.concatenate(prior_logvars)[:n])
        z_prior = mp + torch.exp(0.5 * lvp) * torch.randn(mp.shape, generator=g, dtype=mp.dtype)
        m.update(_decode_metrics_continuous(model, encoded[:n], pairs[:n], z_prior, centroids, tokenizer, strategies))
    if was_training:
        model.train()
    return Evaluation(m, df)


def _decode_metrics_continuous(model: ContinuousCVAE, encoded, pairs, z_prior: torch.Tensor,
                               centroids: np.ndarray | None, tokenizer, strategies) -> dict[str, float]:
    """task/correctness with z drawn from the prior; structure/z_control_accuracy with each k-means
    centroid forced (latent values matched to strategies by the Hungarian algorithm on counts)."""
    prefixes = [e.prefix_ids for e in encoded]
    max_new = max(len(e.target_ids) for e in encoded) + 2
    eos = tokenizer.eos_token_id
    outputs_of = [[" ".join(map(str, STRATEGIES[s](text_to_digits(p.x)))) for s in strategies] for p in pairs]
    dec = model.greedy_decode(prefixes, z_prior.float(), eos_id=eos, max_new_tokens=max_new)
    correct = [tokenizer.decode(d).strip() in outs for d, outs in zip(dec, outputs_of)]
    res = {"task/correctness": float(np.mean(correct)), "structure/z_control_accuracy": float("nan")}
    if centroids is not None:
        counts = np.zeros((len(centroids), len(strategies)))
        for k, c in enumerate(centroids):
            zk = torch.as_tensor(c, dtype=torch.float32).expand(len(prefixes), -1)
            dk = model.greedy_decode(prefixes, zk, eos_id=eos, max_new_tokens=max_new)
            counts[k] = np.array([[tokenizer.decode(d).strip() == o for o in outs]
                                  for d, outs in zip(dk, outputs_of)]).sum(0)
        r, c = linear_sum_assignment(-counts)
        res["structure/z_control_accuracy"] = float(sum(counts[i, j] for i, j in zip(r, c)) / (len(r) * len(prefixes)))
    return res
