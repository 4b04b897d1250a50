"""Shared continuous CVAE (docs/concepts/problem.md#models): the discrete CVAE's backbone sharing with a
Gaussian latent.

  posterior  q_xi(z | x, y) = N(mu_q, diag exp(logvar_q)), a linear head on the z-free features of
                              the y-region (``mean_y`` by default; the same choices as the discrete CVAE);
  prior      p_phi(z | x)   = N(mu_p, diag exp(logvar_p)), a linear head on the separator position
                              (zero-initialized, so N(0, I) at step 0), or N(0, I) fixed (``standard``);
  decoder    p_psi(y | x, z): the backbone with W z entering through the route ``injection``
                              (``zfree.models.routes``; default: added to the input embeddings at the
                              separator and y positions); W (d_model x d_latent) is zero-initialized;
                              under ``latent_capacity='shared_delta'`` s + W z, s a latent-independent
                              vector, zero-initialized too (issue 55, equal capacity across arms).

BN-VAE (Zhu et al. 2020, "A Batch Normalized Inference Network Keeps the KL Vanishing Away", Sec. 3;
``bn_gamma`` > 0, the N(0, I) prior only): the posterior means pass a batch normalization with a
fixed scale gamma and a learned shift beta_d (``posterior_bn``: ``nn.BatchNorm1d``, eps 1e-5,
momentum 0.1, its weight frozen at gamma as in their code),
mu_q,d <- gamma (mu_d - mean_B mu_d) / sqrt(var_B mu_d + eps) + beta_d, with the batch's statistics
in training and the running ones in evaluation. Over a batch mean_B mu_q,d^2 = gamma^2 var_B /
(var_B + eps) + beta_d^2, and sigma^2 - log sigma^2 - 1 >= 0, so the batch-mean KL to N(0, I) is at
least 1/2 sum_d (gamma^2 var_B / (var_B + eps) + beta_d^2) (their bound E[KL] >= 1/2 sum_d (gamma^2 +
beta_d^2) >= d_latent gamma^2 / 2, eps aside; tested). Only mu_q changes: the decoder still equals
the base model at step 0.

delta-VAE (Razavi, van den Oord, Poole & Vinyals 2019, "Preventing Posterior Collapse with
delta-VAEs", ICLR; ``delta_rate`` = delta > 0, the N(0, I) prior only): the posterior family is chosen
so that no member reaches the prior, a *committed rate* KL(q || p) >= delta for every q. Their main
models pair a correlated AR(1) prior over a sequence of latents with an independent posterior; zfree
has one latent vector per example under N(0, I), so this is the other variant of their section on
mismatched posterior and prior families: the posterior variance held to a fixed range, here
(0, sigma_u^2] (no lower bound sigma_l is needed below 1). Per dimension
KL(N(mu, s^2) || N(0, 1)) = 1/2 (mu^2 + s^2 - 1 - ln s^2) decreases in s on (0, 1), so with
s <= sigma_u < 1 its minimum over the family is at mu = 0, s = sigma_u:
KL >= 1/2 (sigma_u^2 - 1 - ln sigma_u^2) per dimension, delta in all when that is delta / d_latent
(``max_posterior_logvar`` solves it for ln sigma_u^2, ``committed_rate`` is its inverse; tested).
The head's raw log-variance r maps to sigma_q^2 = sigma_u^2 sigmoid(r), computed as
logvar_q = ln sigma_u^2 + logsigmoid(r) (``bounded_logvar``): smooth and increasing; logsigmoid <= 0
in floating point too, and ln sigma_u^2 is rounded down to a float32 model's dtype, so sigma_q <= sigma_u
holds exactly (equality only in the limit r -> inf; the KL is >= delta up to the rounding of the KL
formula), and log 0 is never taken. For r << 0 it is the unconstrained head shifted by ln sigma_u^2
(slope 1, the same gradient as without the bound), where sigma_q = sigma_u sigmoid(r) would have
slope 2. At the zero-initialized bias sigma_q^2 = sigma_u^2 / 2.
The committed rate is paid, not information: a KL-based "measured use" reads it as use on every row.

Samples are reparameterized, z = mu_q + exp(logvar_q / 2) * eps, eps ~ N(0, I) (Kingma & Welling
2014, eq. 10), S >= 1 per example; the reconstruction expectation is the mean over the S samples.
Because W = 0 at initialization, every z decodes exactly like the base model (rho_recon = 1 at
step 0; tested). The x-prefix does not depend on z: its key/value cache from the z-free pass is
reused for the S decoder passes over the y-region, as in ``DiscreteCVAE``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from jaxtyping import Bool, Float
from torch import nn
from torch.nn import functional as F

from zfree.config import LatentKind
from zfree.data.batching import Batch
from zfree.models.base import target_logprobs_from_hidden
from zfree.models.decoding import decode_with_latents
from zfree.models.encoder import build_posterior_encoder, pool_posterior_features
from zfree.models.injection import full_target_logprobs, suffix_target_logprobs, zfree_pass
from zfree.models.precision import heads_input
from zfree.models.routes import INJECTIONS, build_route, latent_shared_vector


def committed_rate(max_logvar: float, d_latent: int) -> float:
    """delta-VAE's committed rate (Razavi et al. 2019): the smallest KL(N(mu, diag s^2) || N(0, I)) over
    every mu and every s with ln s^2 <= ``max_logvar`` <= 0, attained at mu = 0, ln s^2 = max_logvar:
    d_latent / 2 * (e^max_logvar - 1 - max_logvar), nats per example (float64). Raises ValueError
    naming the argument for max_logvar > 0 (the minimum is then 0, at s = 1) or d_latent < 1."""
    if not max_logvar <= 0:
        raise ValueError(f"max_logvar={max_logvar!r} must be <= 0 (sigma_u <= 1)")
    if not isinstance(d_latent, int) or d_latent < 1:
        raise ValueError(f"d_latent={d_latent!r} must be an integer >= 1")
    return 0.5 * d_latent * (math.expm1(max_logvar) - max_logvar)


def max_posterior_logvar(delta_rate: float, d_latent: int) -> float:
    """ln sigma_u^2 of delta-VAE's fixed-range posterior: the root u < 0 of
    1/2 (e^u - 1 - u) = delta_rate / d_latent (the committed rate ``committed_rate(u, d_latent)`` equal
    to ``delta_rate`` nats), by Brent's method (scipy.optimize.brentq) on [-(1 + 2 delta / d), 0], where
    the left side is decreasing in u (derivative (e^u - 1) / 2 < 0) and changes sign (+e^-(1 + 2 delta / d)
    at the left end, -delta / d at 0). Solved in u, not sigma_u^2, so a large delta / d keeps its relative
    precision. Raises ValueError naming the argument for delta_rate <= 0 or not finite, or d_latent < 1."""
    from scipy.optimize import brentq  # lazy: only a delta-VAE needs it

    if not (isinstance(delta_rate, (int, float)) and math.isfinite(delta_rate) and delta_rate > 0):
        raise ValueError(f"delta_rate={delta_rate!r} must be a finite number > 0")
    if not isinstance(d_latent, int) or d_latent < 1:
        raise ValueError(f"d_latent={d_latent!r} must be an integer >= 1")
    per_dim = 2.0 * float(delta_rate) / d_latent
    return float(brentq(lambda u: math.expm1(u) - u - per_dim, -(1.0 + per_dim), 0.0, xtol=1e-300,
                        rtol=4 * np.finfo(float).eps, maxiter=500))


@dataclass
class GaussianHeads:
    """The heads on the z-free hidden states: posterior N(mu_q, e^logvar_q), prior N(mu_p, e^logvar_p)."""

    mu_q: Float[torch.Tensor, "batch d_latent"]
    logvar_q: Float[torch.Tensor, "batch d_latent"]
    mu_p: Float[torch.Tensor, "batch d_latent"]  # zeros for the standard prior
    logvar_p: Float[torch.Tensor, "batch d_latent"]  # zeros for the standard prior
    features: Float[torch.Tensor, "batch d_feat"]  # the posterior head's input


@dataclass
class ContinuousCVAEOutput:
    """``ContinuousCVAE.forward``: posterior and prior parameters, the decoded samples and log-probs."""
    posterior_mean: Float[torch.Tensor, "batch d_latent"]  # mu_q
    posterior_logvar: Float[torch.Tensor, "batch d_latent"]  # log sigma_q^2
    prior_mean: Float[torch.Tensor, "batch d_latent"]  # mu_p (zeros for the standard prior)
    prior_logvar: Float[torch.Tensor, "batch d_latent"]  # log sigma_p^2 (zeros for the standard prior)
    z: Float[torch.Tensor, "batch n_samples d_latent"]  # the decoded latents
    target_logprobs: Float[torch.Tensor, "batch n_samples seq"]  # log p(y_t | x, y_<t, z_s) on S, 0 elsewhere
    features: Float[torch.Tensor, "batch d_feat"]  # the posterior head's input
    # the current backbone without z on S (the z-free pass; a metric): None under zfree_metrics=False
    zfree_target_logprobs: Float[torch.Tensor, "batch seq"] | None


class ContinuousCVAE(nn.Module):
    """Diagonal-Gaussian-latent CVAE on a causal LM backbone. ``forward`` returns log-probs, never a loss."""

    FEATURES = ("mean_y", "last", "mean_first", "attention", "encoder")
    PRIORS = ("learned", "standard")
    latent_kind = LatentKind.CONTINUOUS
    #: the modules of the learned prior p(z | x) (the discrete model's router): their own optimizer group
    #: and clip (``zfree_lab.run.run_setup``); none under the standard prior
    ROUTER_MODULES = ("prior_head",)

    def __init__(self, backbone: nn.Module, d_latent: int, posterior_features: str = "mean_y",
                 prior: str = "learned", n_samples: int = 1, bn_gamma: float = 0.0, delta_rate: float = 0.0,
                 injection: str = "embedding", latent_capacity: str = "per_value"):
        """``bn_gamma`` > 0: BN-VAE's fixed scale of the batch-normalized posterior means; ``delta_rate``
        > 0: delta-VAE's committed rate in nats per example (sigma_q <= sigma_u; module docstring); both
        need ``prior='standard'``. ``injection``: where W z enters the decoder (``zfree.models.routes``);
        ``latent_capacity``: W z or s + W z (``latent_vectors``). Raises ValueError naming the argument for
        a bad d_latent, n_samples, posterior_features, prior, bn_gamma, delta_rate, injection or latent_capacity."""
        super().__init__()
        if injection not in INJECTIONS:
            raise ValueError(f"injection={injection!r} is not one of {list(INJECTIONS)}")
        if not isinstance(d_latent, int) or d_latent < 1:
            raise ValueError(f"d_latent={d_latent!r} must be an integer >= 1")
        if not isinstance(n_samples, int) or n_samples < 1:
            raise ValueError(f"n_samples={n_samples!r} must be an integer >= 1")
        if posterior_features not in self.FEATURES:
            raise ValueError(f"posterior_features={posterior_features!r} is not one of {list(self.FEATURES)}")
        if prior not in self.PRIORS:
            raise ValueError(f"prior={prior!r} is not one of {list(self.PRIORS)}")
        if not isinstance(bn_gamma, (int, float)) or not bn_gamma >= 0:
            raise ValueError(f"bn_gamma={bn_gamma!r} must be a number >= 0 (0: no BN-VAE)")
        if bn_gamma > 0 and prior != "standard":
            raise ValueError(f"bn_gamma={bn_gamma} (BN-VAE) bounds the KL to N(0, I): it needs prior='standard', got {prior!r}")
        if not (isinstance(delta_rate, (int, float)) and math.isfinite(delta_rate) and delta_rate >= 0):
            raise ValueError(f"delta_rate={delta_rate!r} must be a finite number >= 0 (0: no delta-VAE)")
        if delta_rate > 0 and prior != "standard":
            raise ValueError(f"delta_rate={delta_rate:g} (delta-VAE) commits a rate against N(0, I): it needs "
                             f"prior='standard', got {prior!r}")
        d = backbone.get_input_embeddings().weight.shape[1]
        self.backbone = backbone
        self.d_latent, self.n_samples, self.prior, self.posterior_features = d_latent, n_samples, prior, posterior_features
        if posterior_features == "attention":
            self.pool_query = nn.Parameter(torch.zeros(d))  # zero query = mean_y at init
        if posterior_features == "encoder":
            self.encoder = build_posterior_encoder(backbone)
        self.posterior_head = nn.Linear(2 * d if posterior_features == "mean_first" else d, 2 * d_latent)
        nn.init.normal_(self.posterior_head.weight, std=0.02)  # mu_q differs across examples from step 0
        nn.init.zeros_(self.posterior_head.bias)  # sigma_q = 1
        self.posterior_bn = None
        if bn_gamma > 0:  # BN-VAE (Zhu et al. 2020, Sec. 3): fixed scale gamma, learned shift (0 at init)
            self.posterior_bn = nn.BatchNorm1d(d_latent)
            nn.init.constant_(self.posterior_bn.weight, float(bn_gamma))
            self.posterior_bn.weight.requires_grad_(False)
        # delta-VAE: ln sigma_u^2, a float (not a buffer: recomputed from the config, so checkpoints do not change)
        self.delta_rate = float(delta_rate)
        self.max_logvar = max_posterior_logvar(delta_rate, d_latent) if delta_rate > 0 else None
        if self.max_logvar is not None:  # the float32 value at or below it (round to nearest may round up;
            b32 = np.float32(self.max_logvar)  # compared as Python floats: numpy would compare in float32)
            down = b32 if float(b32) <= self.max_logvar else np.nextafter(b32, np.float32(-np.inf))
            self._max_logvar32 = float(down)
        if prior == "learned":
            self.prior_head = nn.Linear(d, 2 * d_latent)
            nn.init.zeros_(self.prior_head.weight)  # N(0, I) at step 0
            nn.init.zeros_(self.prior_head.bias)
        self.latent_proj = nn.Linear(d_latent, d, bias=False)
        nn.init.zeros_(self.latent_proj.weight)  # decoder == base model at step 0 (docs/concepts/problem.md#models)
        self.shared_prefix = True  # reuse the x-prefix's key/value cache for the S decoder passes
        self.shared_prefix_mode: str | None = None  # decoder_hidden_suffix's mode (None: injection.SHARED_PREFIX)
        self.injection = build_route(injection, backbone)  # no parameters for embedding and mid
        self.register_parameter("latent_shared", latent_shared_vector(latent_capacity, injection, d))  # s or None

    def latent_vectors(self, z: Float[torch.Tensor, "*rows d_latent"]) -> Float[torch.Tensor, "*rows d_model"]:
        """The vector the route receives for latents ``z``: W z (``latent_capacity='per_value'``) or
        s + W z (``shared_delta``: W z a delta on the latent-independent s)."""
        u = self.latent_proj(z)
        return u if self.latent_shared is None else u + self.latent_shared

    def new_parameter_names(self) -> list[str]:
        """Names of the parameters that are not the backbone's (heads, latent projection, encoder)."""
        return [n for n, _ in self.named_parameters() if not n.startswith("backbone.")]

    # -------------------------------------------------------------------- heads

    @property
    def posterior_kind(self) -> str:
        """Which posterior is in use: always ``amortized`` (a head; there is no optimal Gaussian posterior here)."""
        return "amortized"

    def heads_from_hidden(self, h: Float[torch.Tensor, "batch seq d_model"], batch: Batch) -> GaussianHeads:
        """Posterior and prior parameters and the posterior features from the z-free hidden states (B, T, D);
        under BN-VAE mu_q is batch-normalized (``posterior_bn``; training mode: this batch's statistics),
        under delta-VAE logvar_q = ln sigma_u^2 + logsigmoid(the head's raw output)."""
        h = heads_input(h)  # float32 heads over a bfloat16 body's states
        B = h.shape[0]
        rows = torch.arange(B, device=h.device)
        feats = pool_posterior_features(self, self.posterior_features, h, batch)
        mu_q, logvar_q = self.posterior_head(feats).chunk(2, -1)
        if self.posterior_bn is not None:  # BN-VAE: batch statistics in training, running ones in evaluation
            mu_q = self.posterior_bn(mu_q)
        if self.max_logvar is not None:  # delta-VAE: sigma_q^2 = sigma_u^2 sigmoid(raw) <= sigma_u^2
            logvar_q = self.bounded_logvar(logvar_q)
        sep = h[rows, batch.prefix_len - 1]  # sees only x
        if self.prior == "learned":
            mu_p, logvar_p = self.prior_head(sep).chunk(2, -1)
        else:
            mu_p, logvar_p = torch.zeros_like(mu_q), torch.zeros_like(logvar_q)
        return GaussianHeads(mu_q, logvar_q, mu_p, logvar_p, feats)

    def bounded_logvar(self, raw: Float[torch.Tensor, "batch d_latent"]) -> Float[torch.Tensor, "batch d_latent"]:
        """delta-VAE's posterior log-variance ln sigma_u^2 + logsigmoid(raw) (module docstring), in float32
        at least (a bfloat16 head under autocast would round ln sigma_u^2 by ~0.4 %), with ln sigma_u^2
        rounded down to float32 for a float32 raw: sigma_q <= sigma_u exactly in the output's dtype."""
        raw = raw.to(torch.promote_types(raw.dtype, torch.float32))
        bound = self.max_logvar if raw.dtype == torch.float64 else self._max_logvar32
        return bound + F.logsigmoid(raw)

    def encode(self, batch: Batch) -> GaussianHeads:
        """The z-free pass (no key/value cache) and the heads on it: q and the prior without decoding."""
        h, _ = self._zfree_pass(batch, use_cache=False)
        return self.heads_from_hidden(h, batch)

    def _zfree_pass(self, batch: Batch, use_cache: bool, prefix_only: bool = False):
        return zfree_pass(self.backbone, batch, use_cache, prefix_only)

    # -------------------------------------------------------------------- decoder

    def decoder_hidden_naive(self, batch: Batch, z: Float[torch.Tensor, "batch n_samples d_latent"]
                             ) -> Float[torch.Tensor, "batch n_samples seq d_model"]:
        """Decoder hidden states for each sample by a full pass over the whole sequence (reference path)."""
        return self.injection.full(self.backbone, batch, self.latent_vectors(z))

    def decoder_suffix_shared_prefix(self, batch: Batch, cache, z: Float[torch.Tensor, "batch n_samples d_latent"]
                                     ) -> tuple[torch.Tensor, Bool[torch.Tensor, "batch pos"]]:
        """Decoder hidden states over the y-region for each sample, reusing the z-free pass's key/value
        cache of the x-prefix; returns (hidden (B, n, L, D) at the positions predicting S, valid (B, L)).
        Same layout as ``DiscreteCVAE.decoder_suffix_shared_prefix`` with W z_s in place of e_k;
        equals ``decoder_hidden_naive`` (tested)."""
        return self.injection.suffix(self.backbone, batch, cache, self.latent_vectors(z),
                                     shared_prefix=self.shared_prefix_mode)

    def sample_posterior(self, mu: torch.Tensor, logvar: torch.Tensor, n_samples: int,
                         generator: torch.Generator | None = None) -> Float[torch.Tensor, "batch n_samples d_latent"]:
        """Reparameterized samples z = mu + exp(logvar / 2) * eps (Kingma & Welling 2014, eq. 10), eps drawn
        on ``generator``'s device (mu's without one) and moved to mu's: (B, n_samples, d_latent)."""
        eps = torch.randn((mu.shape[0], n_samples, mu.shape[1]), generator=generator, dtype=mu.dtype,
                          device=generator.device if generator is not None else mu.device).to(mu.device)
        return mu[:, None] + torch.exp(0.5 * logvar)[:, None] * eps

    def forward(self, batch: Batch, z: Float[torch.Tensor, "batch n_samples d_latent"] | None = None,
                n_samples: int | None = None, generator: torch.Generator | None = None,
                zfree_metrics: bool = True) -> ContinuousCVAEOutput:
        """Posterior, prior and per-sample decoder log-probs. ``z`` (given) replaces the posterior
        samples; otherwise ``n_samples`` (default ``self.n_samples``) are drawn from q with
        ``generator`` (default: torch's global generator). ``zfree_metrics`` False (the training step):
        no z-free head on y (``zfree_target_logprobs`` None), and under the separate ``encoder`` the
        z-free pass covers the x-prefix alone (every other posterior pools the y-region's states)."""
        full = zfree_metrics or self.posterior_features != "encoder"
        h0, cache = self._zfree_pass(batch, use_cache=self.shared_prefix, prefix_only=not full)
        hd = self.heads_from_hidden(h0, batch)
        if z is None:
            z = self.sample_posterior(hd.mu_q, hd.logvar_q, n_samples or self.n_samples, generator)
        # the current backbone without z (a metric)
        t0 = target_logprobs_from_hidden(self.backbone, h0, batch) if zfree_metrics else None
        if self.shared_prefix:
            hz, valid = self.decoder_suffix_shared_prefix(batch, cache, z)  # (B, n, L, D)
            tlp, _ = suffix_target_logprobs(self.backbone, batch, hz, valid)
        else:
            tlp, _ = full_target_logprobs(self.backbone, batch, self.decoder_hidden_naive(batch, z))
        return ContinuousCVAEOutput(hd.mu_q, hd.logvar_q, hd.mu_p, hd.logvar_p, z, tlp, hd.features, t0)

    # -------------------------------------------------------------------- generation

    @torch.no_grad()
    def greedy_decode(self, prefixes: Sequence[Sequence[int]], z: Float[torch.Tensor, "rows d_latent"], *,
                      eos_id: int, max_new_tokens: int) -> list[list[int]]:
        """Greedy decoding of y given each prefix ([bos] + x + [sep]) and one latent vector per row;
        rows are grouped by prefix length (no padding). Returns generated ids without the end token."""
        dev = next(self.parameters()).device
        return decode_with_latents(self.backbone, prefixes, self.latent_vectors(z.to(dev)), eos_id=eos_id,
                                   max_new_tokens=max_new_tokens)
