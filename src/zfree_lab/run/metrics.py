"""What z explains: one evaluation of a CVAE of either latent kind on the validation rows, the
objective from the assembler training uses (the keys of docs/concepts/metrics.md).

rho_recon = R_val / c_base is a ratio of means; the per-example rho_i = lbar_i / b_i, a mean of
ratios, is reported only under its own name (docs/concepts/metrics.md).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from sklearn.metrics import normalized_mutual_info_score

from zfree.config import LatentKind, ObjectiveConfig
from zfree.data.batching import EncodedPair, collate
from zfree.data.pairs import Pair
from zfree_lab.run import latent_meaning
from zfree_lab.run.latent_meaning import MeaningRows, token_lifts
from zfree.evaluate.readouts import (IW_SAMPLES, READOUT_COLUMNS, discrete_readouts, gaussian_readouts, readout_metrics,
                                    shuffle_permutation)
from zfree.evaluate.latent_stats import (active_units, categorical_mutual_information, continuous_decode_metrics,
                                         decode_metrics, gaussian_mutual_information, hungarian_accuracy, label_keys,
                                         label_structure_metrics, latent_samples, probe_accuracy)
from zfree.models.nll import masked_mean_token_nll
from zfree.objective.losses import base_token_matrix, inter_latent_jsd, reconstruction_per_value
from zfree.objective.objectives import GIVEN, assemble
from zfree.models.precision import acc_dtype
from zfree.objective.theory import excess_nll, predicted_use
from zfree.evaluate.use import ARGMAX_TIE, CODE_USED_FRACTION, measured_use, tied_argmax  # noqa: F401 (re-exported)


@dataclass
class Evaluation:
    """The metric keys (docs/concepts/metrics.md) and the per-example table (one row per validation
    row)."""

    metrics: dict[str, float]
    per_example: pd.DataFrame
    samples: pd.DataFrame | None = None  # greedy/sampled y per latent value (rows without a notion of correct y)
    #: a discrete posterior run's token lifts per row (``zfree_lab.run.latent_meaning``) and its
    #: posterior (N, K); None for a given z (control, oracle) and for Gaussian runs
    meaning: MeaningRows | None = None
    q: np.ndarray | None = None
    p: np.ndarray | None = None  # the prior/router p(z | x) (N, K), where q is kept


def _per_example_columns(df: pd.DataFrame, pairs: Sequence[Pair], b: np.ndarray) -> np.ndarray:
    """Adds strategy, b, rho_i, bayes_nll, n_consistent, labels and predicted_use to ``df`` in place;
    returns the per-row Bayes NLL (nats per sequence; NaN where unknown)."""
    df.insert(1, "strategy", [p.strategy for p in pairs])
    df["b"] = b
    df["rho_i"] = df["lbar"] / df["b"]
    bayes = np.array([np.nan if p.bayes_nll is None else p.bayes_nll for p in pairs], float)
    df["bayes_nll"] = bayes
    df["n_consistent"] = [p.n_consistent for p in pairs]
    for k in label_keys(pairs):  # general labels: one column each, None where a row lacks it
        df[f"label/{k}"] = [None if p.labels is None or k not in p.labels else str(p.labels[k]) for p in pairs]
    known = bool(np.isfinite(bayes).all())
    excess_seq = excess_nll(df["n_tokens"], df["b"], bayes) if known else None
    df["predicted_use"] = predicted_use(df["beta_eff"].to_numpy(), bayes if known else None, excess_seq)
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
    held-out probe of ``features``; all NaN without every strategy label or an assignment."""
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


@dataclass
class EvalContext:
    """What the kinds' ``finish`` reads besides the per-example table: c_base and the rows to decode."""

    c_base: float
    n_decode: int  # rows greedily decoded (0: none)
    encoded: Sequence[EncodedPair]
    pairs: Sequence[Pair]
    tokenizer: object
    strategies: Sequence[str] | None


def _frame(batch, br, lbar: torch.Tensor, out, **extra) -> pd.DataFrame:
    """The per-example columns both kinds share, then the kind's own ``extra`` columns, then zfree_nll."""
    cols = {"id": batch.ids, "n_tokens": batch.target_len.cpu().numpy(), "lbar": lbar.cpu().numpy(),
            "kl": br.per_example["kl"].clamp_min(0).cpu().numpy(), "beta_eff": br.beta_eff.cpu().numpy(),
            "weight": br.recon_weight.cpu().numpy(), **{k: v.cpu().numpy() for k, v in extra.items()},
            "zfree_nll": masked_mean_token_nll(-out.zfree_target_logprobs, batch.target_mask).cpu().numpy()}
    return pd.DataFrame(cols)


class DiscreteEvaluator:
    """The discrete CVAE: all K values decoded; q from the head or the optimal posterior."""

    def __init__(self, model, seed: int):
        self.model, self.seed = model, seed
        self.feats, self.q, self.p, self.seq_nll = [], [], [], []  # seq_nll: (B, K) nats/example per value
        self.meaning = (MeaningRows() if latent_meaning.COLLECT_LIFTS and model.posterior_kind != "given"
                        and model.n_latent >= 2 else None)

    def batch(self, batch, objective, step, c_base, b, base_tok):
        """One batch under no_grad: the per-example frame and the objective's breakdown (``assemble``)."""
        if self.model.posterior_kind == "given":  # the control, a label oracle: training's objective (GIVEN)
            return self._given_batch(batch, objective, step, c_base, b, base_tok)
        out = self.model(batch, with_distributions=True)
        tok_nll = -out.target_logprobs  # (B, K, T)
        nll_k = masked_mean_token_nll(tok_nll, batch.target_mask)  # (B, K) plain per-token means
        recon = reconstruction_per_value(tok_nll, batch.target_mask, objective, base_tok)
        jsd = inter_latent_jsd(out.next_token_logprobs, torch.softmax(out.prior_logits, -1), out.pos_mask)
        br = assemble(LatentKind.DISCRETE, objective, recon=recon, target_len=batch.target_len, step=step,
                      c_base=c_base, b=b, q_logits=out.posterior_logits, p_logits=out.prior_logits,
                      jsd=jsd)  # None: the optimal q
        q = self._keep(out, br)
        self.seq_nll.append((nll_k * batch.target_len[:, None].to(nll_k.dtype)).cpu().numpy())
        if self.meaning is not None:  # what each value promotes in the rows' own y (latent_meaning)
            self.meaning.add(batch.ids, batch.input_ids, batch.target_mask,
                             token_lifts(out.target_logprobs, q, batch.target_mask))
        return _frame(batch, br, (q * nll_k).sum(-1), out, posterior_argmax=tied_argmax(q), q_max=q.max(-1).values,
                      oracle_nll=nll_k.min(-1).values, oracle_latent=tied_argmax(-nll_k),
                      decoder_jsd=jsd.clamp_min(0)), br

    def _given_batch(self, batch, objective, step, c_base, b, base_tok):
        """A given z: only the given value is decoded (``forward_given``); its nll is the oracle nll
        and the decoder JSD is 0 (one value per row)."""
        sel = self.model.forward_given(batch)
        nll = masked_mean_token_nll(-sel.selected_logprobs, batch.target_mask)  # (B,)
        recon = reconstruction_per_value(-sel.selected_logprobs[:, None], batch.target_mask, objective, base_tok)[:, 0]
        br = assemble(GIVEN, objective, recon=recon, target_len=batch.target_len, step=step, c_base=c_base, b=b,
                      q_logits=sel.posterior_logits, p_logits=sel.prior_logits)
        q = self._keep(sel, br)
        # every value decoded for the readouts (the router's marginal); one value: the given pass itself
        nll_all = (masked_mean_token_nll(-self.model(batch).target_logprobs, batch.target_mask)
                   if self.model.n_latent >= 2 else nll[:, None])
        self.seq_nll.append((nll_all * batch.target_len[:, None].to(nll_all.dtype)).cpu().numpy())
        return _frame(batch, br, nll, sel, posterior_argmax=sel.z, q_max=q.max(-1).values, oracle_nll=nll,
                      oracle_latent=sel.z, decoder_jsd=torch.zeros_like(nll)), br

    def _keep(self, out, br) -> torch.Tensor:
        """The batch's posterior q (B, K) from ``br``; its features, q and router kept for ``finish``."""
        q = torch.softmax(br.per_example["q_logits"], -1)
        self.feats.append(out.features.cpu().numpy())
        self.q.append(q.cpu().numpy())
        self.p.append(torch.softmax(out.prior_logits, -1).cpu().numpy())
        return q

    def finish(self, df, bayes, ctx: EvalContext) -> dict[str, float]:
        """The kind's latent/*, structure/* and decode metrics; adds its columns (measured_use, ...) to ``df``."""
        K = self.model.n_latent
        qa = np.concatenate(self.q)
        q_mean = qa.mean(0)
        usage = np.bincount(df["posterior_argmax"], minlength=K) / len(df)
        codes = int((usage >= CODE_USED_FRACTION).sum())
        df["measured_use"] = measured_use(df["kl"], bayes, math.log(max(K, 2)), codes_used=codes)
        m = {
            "latent/oracle_rho": float(df["oracle_nll"].mean()) / ctx.c_base,
            "latent/q_max_mean": float(df["q_max"].mean()),
            "latent/codes_used": codes,
            "latent/usage_entropy": float(-(q_mean * np.log(np.clip(q_mean, 1e-30, None))).sum()),
            "latent/max_usage": float(usage.max()),
            **{f"latent/usage/{k}": float(u) for k, u in enumerate(usage)},  # share of rows whose argmax is k
            "latent/decoder_jsd": float(df["decoder_jsd"].mean()),
        }
        m["latent/mutual_information"] = categorical_mutual_information(qa)  # H(mean q) - mean H(q), exact
        r = discrete_readouts(np.concatenate(self.seq_nll), qa, np.concatenate(self.p),
                              shuffle_permutation(len(df), self.seed))
        for k in READOUT_COLUMNS:
            df[k] = r[k]
        m["readout/iw_samples"] = 0.0  # the marginal is exact (a sum over the K values)
        m.update(_structure_metrics(df, np.concatenate(self.feats), self.seed))
        m.update(label_structure_metrics(df, np.concatenate(self.feats), df["posterior_argmax"].to_numpy(), self.seed))
        if ctx.n_decode:
            n = ctx.n_decode
            m.update(decode_metrics(self.model, ctx.encoded[:n], ctx.pairs[:n], np.concatenate(self.p)[:n],
                                    ctx.tokenizer, ctx.strategies, seed=self.seed))
        return m


class GaussianEvaluator:
    """The continuous CVAE: ``model.n_samples`` posterior samples from its own generator seeded by
    ``seed`` (on the model's device); assignments are k-means clusters of the posterior means."""

    def __init__(self, model, seed: int):
        self.model, self.seed = model, seed
        self.gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
        self.mus, self.logvars, self.prior_mus, self.prior_logvars = [], [], [], []
        # the readouts draw from their own generators, so the evaluation's posterior samples stay as they were
        self.perm_gen = np.random.default_rng(seed)  # D_shuffled's within-batch permutations
        self.readout_gen = torch.Generator(device=self.gen.device).manual_seed(seed + 1)

    def batch(self, batch, objective, step, c_base, b, base_tok):
        """One batch under no_grad: the per-example frame and the objective's breakdown (``assemble``)."""
        out = self.model(batch, generator=self.gen)
        tok_nll = -out.target_logprobs  # (B, S, T)
        nll_s = masked_mean_token_nll(tok_nll, batch.target_mask)  # (B, S) plain per-token means
        recon = reconstruction_per_value(tok_nll, batch.target_mask, objective, base_tok)
        learned = self.model.prior == "learned"
        br = assemble(LatentKind.CONTINUOUS, objective, recon=recon, target_len=batch.target_len, step=step, c_base=c_base, b=b,
                      mu_q=out.posterior_mean, logvar_q=out.posterior_logvar, mu_p=out.prior_mean if learned else None,
                      logvar_p=out.prior_logvar if learned else None)
        self.mus.append(out.posterior_mean.cpu().numpy())
        self.logvars.append(out.posterior_logvar.cpu().numpy())
        self.prior_mus.append(out.prior_mean.cpu().numpy())
        self.prior_logvars.append(out.prior_logvar.cpu().numpy())
        perm = torch.as_tensor(shuffle_permutation(len(batch), int(self.perm_gen.integers(2**31))),
                               device=out.posterior_mean.device)
        r = gaussian_readouts(self.model, batch, out, self.readout_gen, perm)
        d_q = nll_s.mean(-1) * batch.target_len.to(nll_s.dtype)
        return _frame(batch, br, nll_s.mean(-1), out, posterior_sigma_mean=torch.exp(0.5 * out.posterior_logvar).mean(-1),
                      d_q=d_q, **r), br

    def finish(self, df, bayes, ctx: EvalContext) -> dict[str, float]:
        """The kind's latent/*, structure/* and decode metrics; adds its columns (measured_use, ...) to ``df``."""
        from sklearn.cluster import KMeans  # lazy: ~0.3 s beyond sklearn.metrics, the continuous latent only

        mu, logvar = np.concatenate(self.mus), np.concatenate(self.logvars)
        strategies = ctx.strategies
        names = list(strategies) if strategies else sorted(set(df["strategy"].dropna()))
        n_clusters = min(len(names), len(df))
        centroids = None
        if n_clusters >= 2:
            km = KMeans(n_clusters=n_clusters, n_init=10, random_state=self.seed).fit(mu)
            df["posterior_argmax"], centroids = km.labels_, km.cluster_centers_
        else:
            df["posterior_argmax"] = 0
        df["measured_use"] = measured_use(df["kl"], bayes, math.log(max(n_clusters, 2)))
        nan = float("nan")
        m = {"latent/oracle_rho": nan, "latent/q_max_mean": nan, "latent/codes_used": nan, "latent/usage_entropy": nan,
             "latent/max_usage": nan, "latent/decoder_jsd": nan,  # need a finite set of values: not faked
             "latent/active_units": active_units(mu),
             "latent/mutual_information": gaussian_mutual_information(mu, logvar, seed=self.seed),
             "latent/posterior_sigma_mean": float(df["posterior_sigma_mean"].mean()),
             "readout/iw_samples": float(IW_SAMPLES)}  # the marginal is the IWAE bound
        m.update(_structure_metrics(df, mu, self.seed, assigned=centroids is not None))

        def clusters(key, rows, k):  # the label's own number (>= 2) of clusters when there are no strategies
            return KMeans(n_clusters=k, n_init=10, random_state=self.seed).fit(mu[rows]).labels_
        m.update(label_structure_metrics(df, mu, df["posterior_argmax"].to_numpy() if centroids is not None else None,
                                         self.seed, n_clusters_of=clusters))
        if ctx.n_decode:
            n = ctx.n_decode
            g = torch.Generator().manual_seed(self.seed + 1)
            mp = torch.as_tensor(np.concatenate(self.prior_mus)[:n])
            lvp = torch.as_tensor(np.concatenate(self.prior_logvars)[:n])
            z_prior = mp + torch.exp(0.5 * lvp) * torch.randn(mp.shape, generator=g, dtype=mp.dtype)
            m.update(continuous_decode_metrics(self.model, ctx.encoded[:n], ctx.pairs[:n], z_prior,
                                               centroids, ctx.tokenizer, strategies))
        return m


#: model.latent_kind -> its evaluator
EVALUATORS = {LatentKind.DISCRETE: DiscreteEvaluator, LatentKind.CONTINUOUS: GaussianEvaluator}


#: the most next-token log-probabilities (rows x K x |S| x vocab, float32) one evaluation batch may
#: hold (128 MiB a tensor; the decoder JSD makes ~5 temporaries of that size): docs/results/real-models.md
EVAL_LOGIT_ELEMENTS = 2**25


def eval_batch_rows(model, encoded: Sequence[EncodedPair], batch_size: int) -> int:
    """Rows per evaluation batch: ``batch_size``, fewer where rows x K x max |S| x vocab would exceed
    ``EVAL_LOGIT_ELEMENTS`` (at least 1). Per-example metrics do not depend on it."""
    if not encoded:
        return batch_size
    vocab = model.backbone.get_input_embeddings().weight.shape[0]
    k = getattr(model, "n_latent", getattr(model, "n_samples", 1))
    longest = max(len(e.target_ids) for e in encoded)
    return max(1, min(batch_size, EVAL_LOGIT_ELEMENTS // max(1, k * longest * vocab)))


@torch.no_grad()
def evaluate(model, encoded: Sequence[EncodedPair], pairs: Sequence[Pair], *, b: np.ndarray, c_base: float,
             objective: ObjectiveConfig, step: int, pad_id: int, tokenizer=None, strategies: Sequence[str] | None = None,
             decode_rows: int = 0, batch_size: int = 128, base_token_nll: dict | None = None,
             seed: int = 0, rho_denominator: float | None = None) -> Evaluation:
    """Evaluate a discrete or continuous CVAE on validation rows, in eval mode under no_grad.

    ``b`` (n_rows,): the frozen base surprisal, nats per token; ``base_token_nll`` (id -> per-token
    b_t over S): needed under token weighting; ``decode_rows``: rows greedily decoded when a tokenizer
    and strategies are given (without strategies a discrete model's ``latent_samples``). ``c_base`` is
    the objective's; rho_recon and oracle_rho divide by ``rho_denominator``, default the evaluated
    rows' mean b (``reference/c_eval``), so a decoder equal to the base reads exactly 1.

    Returns the keys of docs/concepts/metrics.md. Keys that need strategy labels, or (Gaussian latent)
    a finite set of values, are NaN, never faked; a Gaussian latent's ``posterior_argmax`` is the
    k-means cluster of its posterior means. Raises KeyError for another latent_kind.
    """
    if model.latent_kind not in EVALUATORS:
        raise KeyError(f"latent_kind={model.latent_kind!r} is not one of {sorted(map(str, EVALUATORS))}")
    kind = EVALUATORS[model.latent_kind](model, seed)
    was_training = model.training
    model.eval()
    dev, acc = next(model.parameters()).device, acc_dtype(next(model.parameters()).dtype)
    rows, fr = [], []
    batch_size = eval_batch_rows(model, encoded, batch_size)
    for i in range(0, len(encoded), batch_size):
        batch = collate(encoded[i : i + batch_size], pad_id=pad_id).to(dev)
        bb = torch.as_tensor(b[i : i + len(batch)], dtype=acc, device=dev)
        base_tok = (base_token_matrix(batch.target_mask, batch.prefix_len, [base_token_nll[r] for r in batch.ids],
                                      dtype=acc)
                    if objective.weighting == "token" and base_token_nll is not None else None)
        frame, br = kind.batch(batch, objective, step, c_base, bb, base_tok)
        rows.append(frame)
        fr.append({k: float(v) for k, v in br.contributions.items()})
    df = pd.concat(rows, ignore_index=True)
    bayes = _per_example_columns(df, pairs, b)
    c_eval = float(np.mean(b)) if rho_denominator is None else float(rho_denominator)
    n_decode = min(decode_rows, len(encoded)) if decode_rows and tokenizer is not None and strategies is not None else 0
    ctx = EvalContext(c_eval, n_decode, encoded, pairs, tokenizer, strategies)
    m: dict[str, float] = {**_loss_metrics(df, fr, c_eval, step), **kind.finish(df, bayes, ctx)}
    m.update(readout_metrics(df))
    m["latent/measured_use_fraction"] = float(df["measured_use"].mean())
    m["latent/predicted_use_fraction"] = float(df["predicted_use"].mean())
    m.update(_objective_metrics(df, c_base, objective))
    m["reference/c_eval"] = c_eval
    samples = None
    if strategies is None and tokenizer is not None and decode_rows and model.latent_kind == LatentKind.DISCRETE:
        t_samples = time.time()
        samples = latent_samples(model, encoded, pairs, tokenizer, seed=seed)  # no notion of a correct y
        m["decode/samples_s"] = time.time() - t_samples  # wall seconds (the estimate's probe reads it)
    if was_training:
        model.train()
    meaning = getattr(kind, "meaning", None)
    kept = meaning is not None and meaning.ids
    return Evaluation(m, df, samples, meaning=meaning, q=np.concatenate(kind.q) if kept else None,
                      p=np.concatenate(kind.p) if kept else None)
