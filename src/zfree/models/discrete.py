"""Shared discrete CVAE (docs/concepts/problem.md#models): one backbone, initialized from the z-free
base model, serves

  posterior  q_xi(z | x, y)  a linear head on the mean of the z-free hidden states over the y-region
                             (``mean_y``, default), the last position (``last``), the mean joined with
                             the first y position (``mean_first``), an attention pooling or a separate
                             encoder; or no head (``optimal``: the objective computes the q that
                             minimizes it from the K decoders, ``losses.optimal_posterior_logits``);
  router     p_phi(z | x)    a linear head on the separator position (the last prefix position,
                             which predicts the first y token and sees only x);
  decoder    p_psi(y | x, z) the backbone with a latent embedding e_z entering through the route
                             ``injection`` (``zfree.models.routes``): added to the input embeddings
                             at the separator and y positions (``embedding``, the default), to the
                             residual stream at mid-depth (``mid``), as a per-layer key/value
                             (``memory``) or as a soft token before the separator (``prefix``).

e_z is zero-initialized, so at initialization every latent value decodes exactly like the base
model (rho_recon = 1 at step 0; tested), under ``prefix`` like the base model reading the initial
soft token (its own reference: a soft token changes the context; ``zfree.models.routes``). The reconstruction expectation is exact: all K values
are decoded. Under ``latent_capacity='shared_delta'`` the vector entering the route is s + e_z, s one
latent-independent vector (also zero at initialization) that every arm, the z-free control included,
trains on every row, and e_z the value's delta on it (``latent_vectors``; issue 55, equal capacity).

A *given* z (``latent_source``) replaces the posterior by a fixed
one-hot q on a value known per row: ``control`` (K = 1, every row value 0: the z-free control, the
same decoder and parameters as a collapsed CVAE, z carrying nothing) or ``label:<key>`` (the row's
label value: a label oracle). The router then reads the separator state *detached*, a probe whose
cross-entropy -log p(label | x) on validation rows estimates H(label | x) without changing the
decoder's training, which is the control's plus the label's embedding: no gradient of it reaches
the decoder, and training clips the router's gradient on its own (``OptimConfig.router_clip``), so it
cannot rescale the decoder's update either (issue 55).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from jaxtyping import Bool, Float, Int
from torch import nn

from zfree.config import LatentKind, LatentSource
from zfree.data.batching import Batch
from zfree.models.nll import masked_mean_token_nll
from zfree.models.base import hidden_states, target_logprobs_from_hidden
from zfree.models.encoder import build_posterior_encoder, pool_posterior_features
from zfree.models.injection import full_target_logprobs, suffix_target_logprobs, zfree_pass
from zfree.models.packing import PackedPrefix, packed_prefix, packed_prefix_suffix, packed_suffix, packing_problem
from zfree.models.precision import heads_input, to_device
from zfree.models.routes import INJECTIONS, build_route, latent_shared_vector


@dataclass
class DiscreteHeads:
    """The heads on the z-free hidden states."""

    posterior_logits: Float[torch.Tensor, "batch n_latent"] | None  # q(z | x, y); None: no amortized head ('optimal')
    prior_logits: Float[torch.Tensor, "batch n_latent"]  # router p(z | x), unnormalized
    # the posterior head's input (mean_y under 'optimal' and a given z, for the probe metrics; None
    # where the z-free pass covered only the x-prefix: ``zfree_metrics=False`` without a head reading y)
    features: Float[torch.Tensor, "batch d_feat"] | None


@dataclass
class DiscreteEncoding(DiscreteHeads):
    """``DiscreteCVAE.encode``: the heads plus the z-free hidden states they read."""

    zfree_hidden: Float[torch.Tensor, "batch seq d_model"] | None = None


@dataclass
class DiscreteCVAEOutput:
    """``DiscreteCVAE.forward``: posterior (None without a head) and router logits, per-value decoder log-probs."""
    posterior_logits: Float[torch.Tensor, "batch n_latent"] | None  # q(z | x, y), unnormalized; None: 'optimal'
    prior_logits: Float[torch.Tensor, "batch n_latent"]  # router p(z | x), unnormalized
    target_logprobs: Float[torch.Tensor, "batch n_latent seq"]  # log p(y_t | x, y_<t, z=k) on S, 0 elsewhere
    features: Float[torch.Tensor, "batch d_feat"] | None  # the posterior head's input (None: see DiscreteHeads)
    # the current backbone without z on S (the z-free pass; a metric): None under zfree_metrics=False
    zfree_target_logprobs: Float[torch.Tensor, "batch seq"] | None
    next_token_logprobs: Float[torch.Tensor, "batch n_latent pos vocab"] | None = None  # with_distributions
    pos_mask: Bool[torch.Tensor, "batch pos"] | None = None  # valid entries of next_token_logprobs


@dataclass
class SelectedOutput:
    """``DiscreteCVAE.forward_selected``: the K-way output (decoder log-probs detached), the
    decoded value's log-probs with gradient, the decoded value z and the best value k*."""

    out: DiscreteCVAEOutput
    selected_logprobs: Float[torch.Tensor, "batch seq"]  # log p(y_t | x, y_<t, z) on S, 0 elsewhere
    z: Int[torch.Tensor, "batch"]  # the decoded value per row
    k_star: Int[torch.Tensor, "batch"]  # argmin_k nll_k (ties: the posterior's argmax)


@dataclass
class GivenOutput:
    """``DiscreteCVAE.forward_given``: the one-hot q and the router, the given value z and its
    decoder log-probs (with gradient)."""
    posterior_logits: Float[torch.Tensor, "batch n_latent"]  # one-hot (GIVEN_LOGIT off z)
    prior_logits: Float[torch.Tensor, "batch n_latent"]  # router p(z | x) on detached features
    selected_logprobs: Float[torch.Tensor, "batch seq"]  # log p(y_t | x, y_<t, z) on S, 0 elsewhere
    z: Int[torch.Tensor, "batch"]
    features: Float[torch.Tensor, "batch d_feat"] | None  # None under zfree_metrics=False
    zfree_target_logprobs: Float[torch.Tensor, "batch seq"] | None  # None under zfree_metrics=False


def _best_value(out: DiscreteCVAEOutput, batch: Batch) -> Int[torch.Tensor, "batch"]:
    """k* = argmin_k nll_k from the detached K-way log-probs; ties go to the posterior's argmax
    (uniform without an amortized head)."""
    nll = masked_mean_token_nll(-out.target_logprobs, batch.target_mask)  # (B, K)
    return (nll - 1e-7 * _posterior_probs(out)).argmin(-1)


def _posterior_probs(out: DiscreteCVAEOutput) -> torch.Tensor:
    logits = out.prior_logits.new_zeros(out.prior_logits.shape) if out.posterior_logits is None else out.posterior_logits
    return torch.softmax(logits.detach(), -1)


#: log q of the values a given z excludes: exp underflows to exactly 0 (float32 and float64), so
#: q is exactly one-hot, lbar = r_z and KL = -log p(z | x) exactly, with finite logits
GIVEN_LOGIT = -1e4


def is_given(latent_source: str) -> bool:
    """True for the sources that fix z per row (``control``, ``label:<key>``), not learned by q."""
    return LatentSource.parse(latent_source).given


#: hard_em_decoder -> the decoded value from (output, batch, k*)
DECODED_VALUE = {"best": lambda out, batch, k_star: k_star,
                 "posterior_argmax": lambda out, batch, k_star: _posterior_probs(out).argmax(-1)}


class DiscreteCVAE(nn.Module):
    """K-valued latent CVAE on a causal LM backbone. ``forward`` returns log-probs, never a loss."""

    FEATURES = ("mean_y", "last", "mean_first", "attention", "encoder", "optimal")
    latent_kind = LatentKind.DISCRETE
    #: the modules of the router p(z | x): their own optimizer group and clip (``zfree_lab.run.run_setup``)
    ROUTER_MODULES = ("router_head",)

    def __init__(self, backbone: nn.Module, n_latent: int, posterior_features: str = "mean_y",
                 latent_init_std: float = 0.0, latent_source: str = "posterior", injection: str = "embedding",
                 latent_capacity: str = "per_value"):
        """``injection``: where e_z enters the decoder (``zfree.models.routes.ROUTES``); ``latent_capacity``:
        e_z alone or s + e_z (``latent_vectors``). Raises ValueError naming the argument for a bad n_latent,
        posterior_features, injection or latent_capacity."""
        super().__init__()
        if injection not in INJECTIONS:
            raise ValueError(f"injection={injection!r} is not one of {list(INJECTIONS)}")
        if n_latent < (1 if LatentSource.parse(latent_source).z_free else 2):
            raise ValueError(f"n_latent={n_latent} must be >= 2")
        self.latent_source = latent_source
        self.given = is_given(latent_source)  # parsed once, not per step
        self.given_index: dict[str, int] = {}  # row id -> its value (set_given), a given source only
        if posterior_features not in self.FEATURES:
            raise ValueError(f"posterior_features={posterior_features!r} is not one of {list(self.FEATURES)}")
        d = backbone.get_input_embeddings().weight.shape[1]
        self.backbone = backbone
        self.n_latent = n_latent
        self.posterior_features = posterior_features
        if posterior_features == "attention":
            self.pool_query = nn.Parameter(torch.zeros(d))  # zero query = mean_y at init
        if posterior_features == "encoder":  # a separate bidirectional encoder, from scratch (models/encoder.py)
            self.encoder = build_posterior_encoder(backbone)
        # optimal: no head (posterior_logits are zeros; the objective computes q from the decoders,
        # losses.optimal_posterior_logits); ``features`` are mean_y, for the probe metrics
        self.posterior_head = (None if posterior_features == "optimal" or self.given else
                               nn.Linear(2 * d if posterior_features == "mean_first" else d, n_latent))
        self.router_head = nn.Linear(d, n_latent)
        self.latent_embedding = nn.Embedding(n_latent, d)
        # decoder == base model at step 0 (docs/concepts/problem.md#models)
        nn.init.zeros_(self.latent_embedding.weight)
        if latent_init_std > 0:  # an aid that deliberately breaks the step-0 equivalence
            nn.init.normal_(self.latent_embedding.weight, std=latent_init_std)
        if self.posterior_head is not None:
            nn.init.normal_(self.posterior_head.weight, std=0.02)
            nn.init.zeros_(self.posterior_head.bias)
        nn.init.zeros_(self.router_head.weight)  # router starts uniform
        self.shared_prefix = True  # reuse the x-prefix's key/value cache for the K decoder passes
        # decoder_hidden_suffix's mode (auto / on / off; None: the module default injection.SHARED_PREFIX)
        self.shared_prefix_mode: str | None = None
        # the training step's prefix + decoder passes over packed rows (``packs``; None: the module default
        # packing.PACKING, "auto": on the CPU)
        self.packing_mode: str | None = None
        nn.init.zeros_(self.router_head.bias)
        self.injection = build_route(injection, backbone)  # no parameters for embedding and mid
        # s of shared_delta (zeros: exact at step 0), None otherwise (no tensor: per_value checkpoints unchanged)
        self.register_parameter("latent_shared", latent_shared_vector(latent_capacity, injection, d))

    def latent_vectors(self, z: Int[torch.Tensor, "*rows"]) -> Float[torch.Tensor, "*rows d_model"]:
        """The vector u_z the route receives for latent values ``z`` (any shape): e_z under
        ``latent_capacity='per_value'``, s + e_z under ``shared_delta`` (the value's delta on the shared s)."""
        e = self.latent_embedding(z)
        return e if self.latent_shared is None else e + self.latent_shared

    @torch.no_grad()
    def restart_values(self, dead: list[int], donor: int, noise: float = 0.01) -> None:
        """Dead-value restart: each dead latent value becomes a perturbed copy of ``donor`` (its
        embedding and its posterior and router rows), so it can split the donor's cluster."""
        heads = [h for h in (self.posterior_head, self.router_head) if h is not None]
        for k in dead:
            for w in (self.latent_embedding.weight, *(h.weight for h in heads)):
                w[k] = w[donor] + noise * torch.randn_like(w[donor]) * (w[donor].std() + 1e-3)
            for h in heads:
                h.bias[k] = h.bias[donor] - 0.01

    def new_parameter_names(self) -> list[str]:
        """Names of the parameters that are not the backbone's (heads, latent embeddings, encoder)."""
        return [n for n, _ in self.named_parameters() if not n.startswith("backbone.")]

    @property
    def posterior_kind(self) -> str:
        """Which posterior q(z | x, y) is in use: ``amortized`` (a head; ``posterior_logits`` set),
        ``optimal`` (no head; ``posterior_logits`` is None and the objective computes q from the
        decoders) or ``given`` (one-hot on each row's given value: the control or a label oracle)."""
        if self.given:
            return "given"
        return "optimal" if self.posterior_head is None else "amortized"

    def set_given(self, index: dict[str, int]) -> None:
        """The given value of every row id the model will see (control: 0 for all). ValueError for
        a value outside 0..K-1."""
        bad = [(i, v) for i, v in index.items() if not 0 <= v < self.n_latent]
        if bad:
            raise ValueError(f"row {bad[0][0]!r}: given value {bad[0][1]} outside 0..{self.n_latent - 1}")
        self.given_index = dict(index)

    def given_values(self, batch: Batch) -> Int[torch.Tensor, "batch"]:
        """The given value of each row of ``batch`` (KeyError naming a row without one), built on the host
        from the row ids and copied without blocking (pinned memory on CUDA: a pageable copy would wait
        for the device's queued work, a host round-trip per step)."""
        missing = [i for i in batch.ids if i not in self.given_index]
        if missing:
            raise KeyError(f"row {missing[0]!r} has no given latent value (latent_source={self.latent_source!r})")
        return to_device(torch.tensor([self.given_index[i] for i in batch.ids]), batch.input_ids.device)

    def _given_logits(self, z: Int[torch.Tensor, "batch"], like: torch.Tensor) -> Float[torch.Tensor, "batch n_latent"]:
        """One-hot logits: 0 at z, ``GIVEN_LOGIT`` elsewhere, in the dtype of ``like``."""
        logits = like.new_full((z.shape[0], self.n_latent), GIVEN_LOGIT)
        return logits.scatter(1, z[:, None], 0.0)

    def encode(self, batch: Batch) -> DiscreteEncoding:
        """The z-free pass: the heads and the hidden states (B, T, D) they read."""
        h = hidden_states(self.backbone, batch)  # (B, T, D)
        heads = self.heads_from_hidden(h, batch)
        return DiscreteEncoding(heads.posterior_logits, heads.prior_logits, heads.features, h)

    def heads_from_hidden(self, h: Float[torch.Tensor, "batch seq d_model"], batch: Batch,
                          router_detached: bool = False, probe_features: bool = True) -> DiscreteHeads:
        """Posterior logits (None without a head), router logits at the separator (which sees only x)
        and the posterior features, from the z-free hidden states ``h`` (B, T, D), or (B, P_max, D) of a
        prefix-only pass (``zfree_pass``) when no head reads the y-region. The router reads the
        separator state detached for a given z (a probe) and with ``router_detached`` (the hard phase's
        ``hard_em_router_features='detached'``): its loss then trains the router's head alone.
        ``probe_features`` False: no mean_y features where no head needs them (a given z, 'optimal'):
        ``features`` is None. The heads read ``h`` in float32 (``heads_input``: a bfloat16 body's cast up)."""
        h = heads_input(h)
        rows = torch.arange(h.shape[0], device=h.device)
        sep = h[rows, batch.prefix_len - 1]
        if router_detached:
            sep = sep.detach()
        probe = pool_posterior_features(self, "mean_y", h, batch) if probe_features else None
        if self.given:  # q one-hot on the given value; the router a probe of x
            router = self.router_head(sep.detach())
            return DiscreteHeads(self._given_logits(self.given_values(batch), router), router, probe)
        if self.posterior_head is None:  # optimal: computed by the objective from the decoders
            return DiscreteHeads(None, self.router_head(sep), probe)
        feats = pool_posterior_features(self, self.posterior_features, h, batch)
        return DiscreteHeads(self.posterior_head(feats), self.router_head(sep), feats)

    def reads_zfree_y(self) -> bool:
        """Whether the posterior head reads the z-free states of the y-region (every amortized head but
        the separate ``encoder``, which reads the tokens): only then does a training step need the
        z-free pass over (x, y); otherwise the x-prefix is enough (router, shared prefix)."""
        return self.posterior_head is not None and self.posterior_features != "encoder"

    def _all_values(self, batch: Batch) -> Int[torch.Tensor, "batch n_latent"]:
        return torch.arange(self.n_latent, device=batch.input_ids.device).expand(batch.input_ids.shape[0], -1)

    def decoder_hidden(self, batch: Batch, z: Int[torch.Tensor, "batch n"] | None = None
                       ) -> Float[torch.Tensor, "batch n seq d_model"]:
        """Decoder hidden states (B, n, T, D) for latent values ``z`` (B, n) (default: all K, n = K)
        by a full pass over (x, y) per value (the reference path), through the injection route."""
        z = self._all_values(batch) if z is None else z
        return self.injection.full(self.backbone, batch, self.latent_vectors(z))

    def _encode_with_cache(self, batch: Batch, prefix_only: bool = False):
        """The z-free pass that also returns its key/value cache (reused for the x-prefix; None
        when ``shared_prefix`` is off, and the decoder then takes the full pass); ``prefix_only``:
        over the x-prefix columns only (``zfree_pass``)."""
        return zfree_pass(self.backbone, batch, use_cache=self.shared_prefix, prefix_only=prefix_only)

    def _zfree_heads(self, batch: Batch, router_detached: bool = False, zfree_metrics: bool = True, packed: bool = False):
        """(the heads, log p(y_t) of the current backbone without z (B, T) or None, the key/value cache or
        None) of the z-free pass (``_encode_with_cache``; ``packed``: over packed rows, ``packed_prefix``, its
        ``PackedPrefix`` in place of the cache); ``router_detached`` as ``heads_from_hidden``.

        ``zfree_metrics`` (evaluation): the pass covers (x, y) and also gives the z-free log-probs and
        the probe's mean_y features. Without (the training step, which reads neither): the pass covers
        the x-prefix alone unless the posterior head reads y (``reads_zfree_y``), and no z-free head
        runs, so a step costs the prefix once plus its decoder passes over the y-region."""
        if packed:  # the training step's x-prefix alone (``packs``)
            h0, cache = packed_prefix(self.backbone, batch)
        else:
            h0, cache = self._encode_with_cache(batch, prefix_only=not (zfree_metrics or self.reads_zfree_y()))
        heads = self.heads_from_hidden(h0, batch, router_detached, probe_features=zfree_metrics)
        t0 = target_logprobs_from_hidden(self.backbone, h0, batch) if zfree_metrics else None
        return heads, t0, cache

    def packs(self, batch: Batch, zfree_metrics: bool) -> bool:
        """Whether a step's z-free pass and decoder passes run over packed rows (``zfree.models.packing``:
        one forward, ``packed_prefix_suffix``; hard EM's prefix once, ``packed_prefix``; no padding, equal to
        the padded passes within float rounding): the training step (``zfree_metrics`` False) whose z-free
        pass covers the x-prefix alone (no head reads y), under the embedding route and a shared prefix,
        where ``packing_problem`` finds nothing against it (``packing_mode``)."""
        return (not zfree_metrics and not self.reads_zfree_y() and self.shared_prefix
                and self.injection.name == "embedding" and self.shared_prefix_mode != "off"
                and packing_problem(self.backbone, batch, self.packing_mode) is None)

    def _packed_pass(self, batch: Batch, z: Int[torch.Tensor, "batch n"] | None = None):
        """(the heads without probe features, decoder hidden (B, n, L, D), valid (B, L)) of the packed
        forward (``packs``) for latent values ``z`` (default: all K)."""
        z = self._all_values(batch) if z is None else z
        h0, hz, valid = packed_prefix_suffix(self.backbone, batch, self.latent_vectors(z))
        return self.heads_from_hidden(h0, batch, probe_features=False), hz, valid

    def decoder_suffix_shared_prefix(self, batch: Batch, cache, z: Int[torch.Tensor, "batch n"] | None = None
                                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoder hidden states over the y-region for latent values ``z`` (B, n) (default: all K), reusing the
        z-free pass's key/value cache of the x-prefix ([bos] + x, which does not depend on z; a ``PackedPrefix``:
        ``packed_suffix``): (hidden (B, n, L, D), valid (B, L)), L = max |S| (``models.injection``, ``models.routes``)."""
        z = self._all_values(batch) if z is None else z
        if isinstance(cache, PackedPrefix):
            return packed_suffix(self.backbone, batch, cache, self.latent_vectors(z))
        return self.injection.suffix(self.backbone, batch, cache, self.latent_vectors(z),
                                     shared_prefix=self.shared_prefix_mode)

    def forward(self, batch: Batch, with_distributions: bool = False, zfree_metrics: bool = True) -> DiscreteCVAEOutput:
        """Posterior and router logits and the decoder's per-token log-probs for all K values.
        ``zfree_metrics`` False (the training step): no z-free log-probs or probe features, and the
        z-free pass over the x-prefix alone where no head reads y (``_zfree_heads``), packed with the
        decoder passes into one forward where ``packs``."""
        if self.packs(batch, zfree_metrics):  # one forward over packed rows
            (heads, hz, valid), t0 = self._packed_pass(batch), None
            tlp, dist = suffix_target_logprobs(self.backbone, batch, hz, valid, with_distributions)
        elif self.shared_prefix:
            heads, t0, cache = self._zfree_heads(batch, zfree_metrics=zfree_metrics)
            hz, valid = self.decoder_suffix_shared_prefix(batch, cache)  # (B, K, L, D), (B, L)
            tlp, dist = suffix_target_logprobs(self.backbone, batch, hz, valid, with_distributions)
        else:
            heads, t0, _ = self._zfree_heads(batch, zfree_metrics=zfree_metrics)
            tlp, dist = full_target_logprobs(self.backbone, batch, self.decoder_hidden(batch), with_distributions)
            valid = torch.arange(batch.max_lengths()[1], device=tlp.device)[None, :] < batch.target_len[:, None]
        out = DiscreteCVAEOutput(heads.posterior_logits, heads.prior_logits, tlp, heads.features, t0)
        if with_distributions:
            out.next_token_logprobs, out.pos_mask = dist, valid
        return out

    def forward_selected(self, batch: Batch, choose: str | Callable = "best", estep_tokens: int = 0,
                         router_detached: bool = False, zfree_metrics: bool = True) -> SelectedOutput:
        """Hard-EM forward: the z-free pass (posterior, router) with gradient; the K decoder passes
        without gradient (``out.target_logprobs`` (B, K, T) is detached); one value z (B,) per row,
        decoded again with gradient. ``choose``: a key of ``DECODED_VALUE`` (``best`` = k*,
        ``posterior_argmax``) or a function of the output giving z. The parameter gradient of any
        loss of the selected log-probs equals the gradient through the full K-way graph gathered at
        z (tested), at about a third of its backward cost for K = 6. ``estep_tokens`` > 0: the K
        no-grad passes (and so k* and ``out.target_logprobs``) cover only the first ``estep_tokens``
        tokens of S (``Batch.first_targets``); the decoded value's pass covers all of S.
        ``router_detached``: the router reads the separator state detached (``heads_from_hidden``);
        ``zfree_metrics`` as ``forward`` (packed rows where ``packs``). Raises KeyError listing the keys."""
        if isinstance(choose, str) and choose not in DECODED_VALUE:
            raise KeyError(f"choose={choose!r} is not one of {sorted(DECODED_VALUE)}")
        heads, t0, cache = self._zfree_heads(batch, router_detached, zfree_metrics, self.packs(batch, zfree_metrics))
        e_batch = batch.first_targets(estep_tokens)
        with torch.no_grad():
            hz, valid = self.decoder_suffix_shared_prefix(e_batch, cache)
            tlp_all, _ = suffix_target_logprobs(self.backbone, e_batch, hz, valid)
        out = DiscreteCVAEOutput(heads.posterior_logits, heads.prior_logits, tlp_all, heads.features, t0)
        k_star = _best_value(out, e_batch)
        z = DECODED_VALUE[choose](out, batch, k_star) if isinstance(choose, str) else choose(out)
        hz1, valid = self.decoder_suffix_shared_prefix(batch, cache, z[:, None])
        tlp_z, _ = suffix_target_logprobs(self.backbone, batch, hz1, valid)
        return SelectedOutput(out, tlp_z[:, 0], z, k_star)

    def forward_given(self, batch: Batch, zfree_metrics: bool = True) -> "GivenOutput":
        """A given z (control, label oracle): the z-free pass (router, one-hot q) and one decoder pass
        with the row's given value, with gradient (no other value is decoded). Costs the z-free pass
        plus one suffix pass; with ``zfree_metrics`` False (the training step) the z-free pass covers
        the x-prefix alone, so the step is one pass over (x, y): the prefix, then y with z on its cache, or
        both in one forward over packed rows where ``packs`` (no padding)."""
        z = self.given_values(batch)
        if self.packs(batch, zfree_metrics):  # one forward over packed rows
            (heads, hz, valid), t0 = self._packed_pass(batch, z[:, None]), None
        else:
            heads, t0, cache = self._zfree_heads(batch, zfree_metrics=zfree_metrics)
            hz, valid = self.decoder_suffix_shared_prefix(batch, cache, z[:, None])
        tlp, _ = suffix_target_logprobs(self.backbone, batch, hz, valid)
        return GivenOutput(heads.posterior_logits, heads.prior_logits, tlp[:, 0], z, heads.features, t0)
