"""Frozen, validated configs with a flat round-trip (the papermill parameters).

Every field name is unique across the sub-configs of ``TrainConfig`` so the flat dict is just
``{field: value}``; ``TrainConfig.from_flat(TrainConfig.to_flat(cfg)) == cfg``. Each
``__post_init__`` raises ``ValueError`` naming the offending field. The objective and model
sections are here; the optimizer (``zfree.config.optim``), the aids (``zfree.config.aid``) and the
base model's config (``zfree.config.base``) are in their own modules, and so is a run's identity
(``zfree.config.identity``); every name is imported from ``zfree.config``, the contract every layer reads.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import asdict, dataclass, field, fields
from enum import Enum, StrEnum
from pathlib import Path
from typing import Any, Literal

from zfree.config.aid import Aid, AidConfig  # noqa: F401 (zfree.config.Aid)
from zfree.config.base import BaseTrainConfig  # noqa: F401 (zfree.config.BaseTrainConfig)
from zfree.config.identity import (LATER_FIELD_DEFAULTS, LOG_ONLY_FIELDS, identity_diff,  # noqa: F401 (the run's identity)
                                   run_hash, run_identity, without_log_only)
from zfree.config.latent_source import LatentSource  # noqa: F401 (zfree.config.LatentSource)
from zfree.config.optim import OptimConfig
from zfree.core.errors import ConfigError
from zfree.core.validation import check_choice, check_int, check_range
from zfree.core.values import coerce_value, field_types, typed_fields
from zfree.core.weightings import TOKEN_OUTER_NAMES, WEIGHTING_NAMES, WEIGHTINGS  # the registry
# the registries the choices and checks read (aids, free-bits modes, beta schedules), and later fields
from zfree.config.aid import AIDS
from zfree.config.later import later, later_defaults
from zfree.core.free_bits import FREE_BITS_MODES, FREE_BITS_NAMES
from zfree.core.schedules import SCHEDULE_NAMES, SCHEDULES

Weighting = Literal[WEIGHTING_NAMES]  # plain, distribution, example, token
TokenOuter = Literal[TOKEN_OUTER_NAMES]  # none, distribution, example
BetaSchedule = Literal[SCHEDULE_NAMES]  # the registry zfree.core.schedules.SCHEDULES
FreeBitsMode = Literal[FREE_BITS_NAMES]  # the registry zfree.core.free_bits.FREE_BITS_MODES
CBaseSource = Literal["entangled_run", "pretrained_source"]
PosteriorFeatures = Literal["mean_y", "last", "mean_first", "attention", "encoder", "optimal"]
Injection = Literal["embedding", "prefix", "memory", "mid"]  # zfree.models.routes.ROUTES
LatentCapacity = Literal["per_value", "shared_delta"]  # ModelConfig.latent_capacity


class LatentKind(StrEnum):
    """The CVAE's latent (``ModelConfig.latent_kind``): K discrete values or a diagonal Gaussian
    vector. One name each, everywhere (objectives, evaluators, the model's ``latent_kind``); the
    values are the config's (a str-valued enum: ``LatentKind.CONTINUOUS == "continuous"``)."""

    DISCRETE = "discrete"
    CONTINUOUS = "continuous"


LatentPrior = Literal["learned", "standard"]

# the field checks live in zfree.core.validation (shared with DataConfig beside the benchmark it configures)
_check_choice, _check_int, _check_range = check_choice, check_int, check_range


# --- typed values by declared type (zfree.core.values.coerce_value) --------------------------------

def flat_field_types() -> dict[str, Any]:
    """Declared type of every flat ``TrainConfig`` field (the papermill parameters)."""
    out = {"data_dir": str, "base_dir": str}
    for sub in TrainConfig._SUB.values():
        out.update(field_types(sub))
    return out


def parse_field_value(name: str, value: Any) -> Any:
    """``value`` for the flat ``TrainConfig`` field ``name``, typed by its declaration
    (``coerce_value``). Raises ``ConfigError`` for an unknown field (suggesting the closest) or
    a value of the wrong type (naming the field)."""
    types = flat_field_types()
    if name not in types:
        raise ConfigError(unknown_fields_message([name], types))
    return coerce_value(name, value, types[name])


def unknown_fields_message(unknown: list[str], known) -> str:
    """One line for config field names that do not exist: the closest known name of each
    (``difflib.get_close_matches``), not the whole list of ``known``."""
    def guess(name: str) -> str:
        close = difflib.get_close_matches(name, list(known), n=1)
        return f"{name!r} (did you mean {close[0]!r}?)" if close else f"{name!r} (no field has a close name)"

    return (f"unknown config field{'s' if len(unknown) > 1 else ''} {', '.join(guess(n) for n in unknown)}; "
            f"`zfree train --fields` lists the {len(known)} fields")


def with_default_epsilon(overrides: dict[str, Any], base: dict[str, Any] | None = None) -> dict[str, Any]:
    """``overrides`` (``--set``) with ``epsilon`` at the example weighting's study value (0.05,
    ``WEIGHTINGS["example"].grid``) when they choose a weighting that needs epsilon > 0 (example, or
    token with example outside) without giving epsilon, and ``base`` (the config they override)
    has none > 0: ``--set weighting=example`` then runs the weighting as every study grid and the
    launch panel run it, instead of stopping at ``epsilon=0.0 must be > 0``."""
    merged = {**(base or {}), **overrides}
    chosen = (merged.get("weighting"), merged.get("token_outer"))
    if ("epsilon" in overrides or not {"weighting", "token_outer"} & set(overrides)
            or not any(w in WEIGHTINGS and WEIGHTINGS[w].needs_epsilon for w in chosen)
            or float(merged.get("epsilon") or 0.0) > 0):
        return overrides
    return {**overrides, "epsilon": WEIGHTINGS["example"].grid["epsilon"]}


def check_run_inputs(data_dir: str | Path, base_dir: str | Path) -> tuple[Path, Path]:
    """The data and base folders of a run, checked to hold what training reads first
    (``train.jsonl``, ``val.jsonl``, ``model``): FileNotFoundError naming the missing one and both
    fields. Light (no torch): the executor calls it before it starts a run's kernel."""
    data, base = Path(data_dir), Path(base_dir)
    for f in (data / "train.jsonl", data / "val.jsonl", base / "model"):
        if not f.exists():
            raise FileNotFoundError(f"{f} does not exist (data_dir={str(data_dir)!r}, base_dir={str(base_dir)!r})")
    return data, base


def parse_assignment(text: str) -> tuple[str, Any]:
    """``"FIELD=VALUE"`` (a ``--set``) -> ``(field, typed value)``; ConfigError when it is not."""
    name, eq, value = text.partition("=")
    if not eq or not name.strip():
        raise ConfigError(f"--set {text!r}: expected FIELD=VALUE")
    return name.strip(), parse_field_value(name.strip(), value)


@dataclass(frozen=True)
class ObjectiveConfig:
    """J = w(x,y) * lbar(x,y) + beta * K(x,y) + L_aux (docs/concepts/weightings.md)."""

    weighting: Weighting = "plain"  # reconstruction weight w: 1, 1/c_base, 1/(b + epsilon), or token surprisal shares
    beta: float = 1.0  # KL weight; beta < 1 is InfoVAE-style beta reduction
    epsilon: float = 0.0  # example weighting: w = 1/(b + epsilon); must be > 0 there (--set weighting=example: 0.05)
    token_alpha: float = 1.0  # token weighting: mix of surprisal share (alpha) and uniform (1 - alpha)
    token_outer: TokenOuter = "none"  # token weighting composes with distribution or example
    lambda_jsd: float = 0.0  # weight of the (maximized) inter-latent JSD
    free_bits: float = 0.0  # nats; KL below this is not penalized
    # where free_bits applies: per example, to the batch mean, per dimension, or as a threshold
    free_bits_mode: FreeBitsMode = "none"
    beta_schedule: BetaSchedule = "constant"  # beta over the steps: constant, linear warm-up, or cyclical
    beta_warmup_steps: int = 0  # linear: steps from 0 to beta
    beta_cycle_steps: int = 0  # cyclical (Fu et al. 2019): period in steps
    # cyclical: within each period beta = 0 for the first beta_ratio_zero of it, then linear 0 -> beta
    # over the next beta_ratio_increase, then beta (Fu et al. 2019: 0 / 0.5; Optimus, Li et al. 2020: 0.5 / 0.25)
    beta_ratio_zero: float = 0.0
    beta_ratio_increase: float = 0.5  # cyclical: the fraction of each period over which beta rises 0 -> beta
    ae_steps: int = 0  # AE phase: beta = 0 for the first ae_steps steps (then the schedule above)
    # where c_base comes from: the base run's stored reference (hash-checked) or the source model
    # scoring the validation rows now (docs/concepts/problem.md: the two estimators)
    c_base_source: CBaseSource = "entangled_run"

    def __post_init__(self):
        typed_fields(self)
        _check_choice("weighting", self.weighting, Weighting)
        _check_choice("token_outer", self.token_outer, TokenOuter)
        _check_choice("beta_schedule", self.beta_schedule, BetaSchedule)
        _check_choice("free_bits_mode", self.free_bits_mode, FreeBitsMode)
        _check_choice("c_base_source", self.c_base_source, CBaseSource)
        _check_range("beta", self.beta, 0.0)
        _check_range("lambda_jsd", self.lambda_jsd, 0.0)
        _check_range("free_bits", self.free_bits, 0.0)
        _check_range("token_alpha", self.token_alpha, 0.0, 1.0)
        _check_range("epsilon", self.epsilon, 0.0)
        _check_int("beta_warmup_steps", self.beta_warmup_steps, 0)
        _check_int("beta_cycle_steps", self.beta_cycle_steps, 0)
        _check_int("ae_steps", self.ae_steps, 0)
        _check_range("beta_ratio_zero", self.beta_ratio_zero, 0.0, 1.0)
        _check_range("beta_ratio_increase", self.beta_ratio_increase, 0.0, 1.0, lo_open=True)
        if self.beta_ratio_zero + self.beta_ratio_increase > 1.0 + 1e-12:
            raise ValueError(f"beta_ratio_zero + beta_ratio_increase = {self.beta_ratio_zero + self.beta_ratio_increase:g} "
                             "must be <= 1 (fractions of one cycle)")
        if any(WEIGHTINGS[w].needs_epsilon for w in self._weightings()) and not self.epsilon > 0:
            raise ValueError(f"epsilon={self.epsilon!r} must be > 0 for example weighting (w = 1 / (b + epsilon))")
        if self.token_outer != "none" and self.weighting != "token":
            raise ValueError(f"token_outer={self.token_outer!r} only applies to weighting='token'")
        if (error := SCHEDULES[self.beta_schedule].check(self)) is not None:  # the schedule's own fields
            raise ValueError(error)
        if self.free_bits_mode != "none" and not self.free_bits > 0:
            raise ValueError(f"free_bits={self.free_bits} must be > 0 when free_bits_mode={self.free_bits_mode!r}")

    @property
    def needs_example_b(self) -> bool:
        """True when w or the token weights need the per-example base surprisal b on training rows (example, token)."""
        return WEIGHTINGS[self.weighting].needs_b

    @property
    def needs_c_base(self) -> bool:
        """True when w = 1/c_base appears (distribution, or token with distribution outside)."""
        return any(WEIGHTINGS[w].needs_c_base for w in self._weightings())

    def _weightings(self) -> tuple[str, ...]:
        """The registry entries in play: ``weighting`` and, under token, its outer one ("none" = plain)."""
        return (self.weighting,) + ((self.token_outer,) if self.token_outer != "none" else ())


def check_latent_source(source: str, latent_kind: str, n_latent: int) -> None:
    """ValueError naming ``latent_source`` unless it is "posterior", "control" or "text:<key>" (each with
    n_latent = 1), "label:<key>" or "null:<key>" (a non-empty key), all but the first on the discrete latent
    only (``LatentSource.parse``)."""
    if source is None:
        raise ValueError("latent_source=None: expected 'posterior', 'control' or 'label:<key>'")
    parsed = LatentSource.parse(source)
    if source != "posterior" and latent_kind != "discrete":
        raise ValueError(f"latent_source={source!r} needs latent_kind='discrete'")
    if parsed.z_free and n_latent != 1:
        raise ValueError(f"n_latent={n_latent!r} must be 1 for latent_source={source!r} (z carries nothing"
                         + (": the label is in x)" if parsed.kind == "text" else ")"))


@dataclass(frozen=True)
class ModelConfig:
    """The CVAE: latent kind, K, posterior features (docs/concepts/problem.md#models)."""

    latent_kind: LatentKind = LatentKind.DISCRETE  # K discrete values (exact expectation) or a diagonal Gaussian
    n_latent: int = 4  # K latent values; at least the number of strategies to be able to separate them
    # mean_y: mean of the z-free hidden states over the y-region (prototype probe 0.81 vs 0.65 for
    # last); mean_first: mean_y joined with the first y position's state (keeps order: reverse vs
    # copy differ only in order); attention: a learned attention pooling over the y-region;
    # encoder: a separate small bidirectional transformer over (x, y), trained from scratch (Optimus);
    # optimal (discrete only): no amortized head, q is the posterior that minimizes the objective for
    # the current decoders and router, q(k) ∝ p(k|x) exp(-w_i r_ik / beta) (losses.optimal_posterior_logits)
    posterior_features: PosteriorFeatures = "mean_y"
    # continuous latent only (latent_kind='continuous'; ignored by the discrete CVAE):
    d_latent: int = 16  # dimension of the diagonal Gaussian z
    n_samples: int = 1  # reparameterized samples S per example and step (lbar is their mean)
    prior: LatentPrior = "learned"  # learned: p(z|x) = N(mu(x), diag sigma^2(x)); standard: N(0, I)
    # decoder passes: "auto" reuses the z-free pass's x-prefix key/value cache where that is exact
    # (else the full pass, warned once), "on" requires it (error where inexact), "off" always runs
    # the full pass per latent value (zfree.models.injection.SHARED_PREFIX_MODES)
    shared_prefix: Literal["auto", "on", "off"] = "auto"
    # where the latent enters the decoder (zfree.models.routes): embedding = added to the input embedding
    # at the separator and y positions (Optimus's embedding path); mid = added to the residual stream
    # entering layer n_layer // 2; memory = one key/value per layer in the first position's place for the
    # separator and y queries (Optimus's memory path; needs a token before the separator); prefix = a soft
    # token s + z before the separator (exact at step 0 against the base reading s, not the base itself)
    injection: Injection = later("embedding")
    # what the latent vector u_z entering the route is (issue 55, equal capacity across arms): per_value =
    # its own vector e_z per value (K vectors, so the oracle's K learn apart the shared task bias that the
    # control's one vector learns from every row); shared_delta = s + d_z, one latent-independent vector s
    # that every arm (the control, oracles and null oracles included) trains on every row, and K deltas d_z,
    # both zero-initialised (exact at step 0); under injection='prefix' the route's soft token is s
    latent_capacity: LatentCapacity = later("per_value")
    # where z comes from: "posterior" = the CVAE (q(z|x,y) learned);
    # "control" = the z-free control (K = 1: z carries nothing, the same decoder, optimizer, steps and
    # batches); "label:<key>" = a label oracle (z := the row's label value, K = its number of values;
    # <key> a key of the rows' labels, or "strategy"); "null:<key>" = its null oracle (the label permuted
    # over the rows); "text:<key>" = its text oracle (K = 1 as the control, the label written into x:
    # zfree_lab.run.text_oracle). Control and oracles: discrete only.
    latent_source: str = "posterior"
    # BN-VAE (Zhu et al. 2020, continuous latent with the N(0, I) prior): batch normalization of the
    # posterior means with a fixed scale gamma (their 0.7) and a learned shift, so the expected KL is at
    # least d_latent * gamma^2 / 2; 0 = off
    bn_gamma: float = 0.0
    # delta-VAE (Razavi et al. 2019, the diagonal Gaussian with the N(0, I) prior): the committed rate
    # delta in nats per example; every posterior std is held to sigma <= sigma_u < 1, sigma_u solved from
    # delta / d_latent per dimension, so KL(q || N(0, I)) >= delta for every q (zfree.models.continuous); 0 = off
    delta_rate: float = 0.0

    def __post_init__(self):
        typed_fields(self)
        _check_range("bn_gamma", self.bn_gamma, 0.0)
        if self.bn_gamma > 0 and (self.latent_kind != LatentKind.CONTINUOUS or self.prior != "standard"):
            raise ValueError(f"bn_gamma={self.bn_gamma} (BN-VAE) needs latent_kind='continuous' and prior='standard' "
                             f"(got {self.latent_kind!s}, {self.prior!r})")
        if not (isinstance(self.delta_rate, (int, float)) and math.isfinite(self.delta_rate) and self.delta_rate >= 0):
            raise ConfigError(f"delta_rate={self.delta_rate!r} must be a finite number >= 0 (nats; 0: no delta-VAE)")
        if self.delta_rate > 0 and (self.latent_kind != LatentKind.CONTINUOUS or self.prior != "standard"):
            raise ConfigError(f"delta_rate={self.delta_rate:g} (delta-VAE) commits a rate against N(0, I): it needs "
                              f"latent_kind='continuous' and prior='standard' "
                              f"(got {self.latent_kind!s}, {self.prior!r})")
        check_latent_source(self.latent_source, self.latent_kind, self.n_latent)
        _check_choice("prior", self.prior, LatentPrior)
        _check_choice("shared_prefix", self.shared_prefix, Literal["auto", "on", "off"])
        _check_choice("injection", self.injection, Injection)
        _check_choice("latent_capacity", self.latent_capacity, LatentCapacity)
        _check_int("d_latent", self.d_latent, 1)
        _check_int("n_samples", self.n_samples, 1)
        _check_choice("posterior_features", self.posterior_features, PosteriorFeatures)
        if self.posterior_features == "optimal" and self.latent_kind != LatentKind.DISCRETE:
            raise ValueError("posterior_features='optimal' needs latent_kind='discrete' (it enumerates the K values)")
        if not LatentSource.parse(self.latent_source).z_free and (not isinstance(self.n_latent, int)
                                                                  or self.n_latent < 2):
            raise ValueError(f"n_latent={self.n_latent!r} must be an integer >= 2")


@dataclass(frozen=True)
class TrainConfig:
    """One CVAE run: paths plus the objective, model and optimizer configs."""

    data_dir: str = "data/synth/default"  # folder with train.jsonl and val.jsonl
    base_dir: str = "data/base/default"  # the base run: model/ and reference/ (c_base, per-example b)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    aid: AidConfig = field(default_factory=AidConfig)

    def __post_init__(self):
        typed_fields(self)
        for name in ("data_dir", "base_dir"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name}={getattr(self, name)!r} must be a non-empty path")
        if self.model.latent_kind == LatentKind.CONTINUOUS:
            if "continuous" not in AIDS[self.aid.aid].kinds:
                raise ValueError(f"aid={self.aid.aid!r} applies to latent_kind='discrete' only")
            if self.objective.lambda_jsd > 0:
                raise ValueError(f"lambda_jsd={self.objective.lambda_jsd} > 0 applies to latent_kind='discrete' only")
        mode = FREE_BITS_MODES[self.objective.free_bits_mode]
        if str(self.model.latent_kind) not in mode.kinds:
            raise ValueError(f"free_bits_mode={mode.name!r} applies to latent_kind={' or '.join(map(repr, mode.kinds))} only")
        if self.model.bn_gamma > 0 and self.optim.batch_size < 2:  # batch statistics need two rows
            raise ValueError(f"batch_size={self.optim.batch_size}: bn_gamma={self.model.bn_gamma:g} (BN-VAE) normalizes "
                             "the posterior means by batch statistics, which need batch_size >= 2")
        if self.aid.aid == "aggressive_encoder" and self.model.posterior_features == "optimal":
            raise ValueError("aid='aggressive_encoder' trains an amortized posterior: posterior_features='optimal' has none")
        if self.model.latent_source != "posterior" and (self.aid.aid != "none" or self.objective.lambda_jsd > 0):
            raise ValueError(f"latent_source={self.model.latent_source!r} trains a given z: aid must be 'none' "
                             f"and lambda_jsd 0 (got aid={self.aid.aid!r}, lambda_jsd={self.objective.lambda_jsd})")

    _SUB = {"objective": ObjectiveConfig, "model": ModelConfig, "optim": OptimConfig, "aid": AidConfig}

    def to_flat(self) -> dict[str, Any]:
        """Flat ``{field: value}`` dict of primitives (the papermill parameters)."""
        flat: dict[str, Any] = {"data_dir": self.data_dir, "base_dir": self.base_dir}
        for sub in self._SUB:
            for k, v in asdict(getattr(self, sub)).items():
                assert k not in flat, k
                flat[k] = list(v) if isinstance(v, tuple) else v.value if isinstance(v, Enum) else v
        return flat

    @classmethod
    def flat_fields(cls) -> list[str]:
        """Every flat field name, in ``to_flat`` order."""
        return list(cls().to_flat())

    @classmethod
    def from_flat(cls, flat: dict[str, Any]) -> "TrainConfig":
        """Build and validate from a flat dict; unknown keys raise ValueError naming them."""
        flat = dict(flat)
        known = set(cls.flat_fields())
        unknown = sorted(set(flat) - known)
        if unknown:
            raise ValueError(unknown_fields_message(unknown, known))
        subs = {}
        for sub, sub_cls in cls._SUB.items():
            names = {f.name for f in fields(sub_cls)}
            subs[sub] = sub_cls(**{k: flat.pop(k) for k in list(flat) if k in names})
        return cls(**flat, **subs)

    def replace(self, **flat_updates) -> "TrainConfig":
        """A copy with flat fields replaced, validated again (ValueError naming a bad or unknown field)."""
        return TrainConfig.from_flat({**self.to_flat(), **flat_updates})


#: every field declared with ``later(default)`` (``zfree.config.later``) joins ``LATER_FIELD_DEFAULTS``: a new
#: field is declared at its section only (the dict above lists the ones declared before it; tests/test_config.py)
LATER_FIELD_DEFAULTS.update(later_defaults(*TrainConfig._SUB.values()))
