"""zfree.config: every bad input raises ValueError naming its field; the flat round trip."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zfree.config import ModelConfig, ObjectiveConfig, OptimConfig, TrainConfig
from zfree.data.synth import STRATEGIES, DataConfig


@pytest.mark.parametrize("kwargs,field", [
    ({"strategies": ("sort_asc", "shuffle")}, "strategies"),
    ({"strategies": "copy"}, "strategies"),
    ({"strategies": ("copy", "copy")}, "strategies"),
    ({"strategies": ()}, "strategies"),
    ({"n_min": 5, "n_max": 4}, "n_min"),
    ({"n_min": 0}, "n_min"),
    ({"n_min": 2.5}, "n_min"),
    ({"vocab_size": 1}, "vocab_size"),
    ({"prior": "zipf"}, "prior"),
    ({"prior_strength": 0.0}, "prior_strength"),
    ({"n_val": 0}, "n_val"),
    ({"seed": -1}, "seed"),
])
def test_data_config_rejects_bad_input_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        DataConfig(**kwargs)


def test_unknown_strategy_message_lists_valid_ones():
    with pytest.raises(ValueError) as e:
        DataConfig(strategies=("sort_asc", "shuffle"))
    assert "'shuffle'" in str(e.value)
    assert all(name in str(e.value) for name in STRATEGIES)


def test_data_config_accepts_a_list_and_stores_a_tuple():
    cfg = DataConfig(strategies=["copy", "reverse"])
    assert cfg.strategies == ("copy", "reverse")
    assert cfg == DataConfig(strategies=("copy", "reverse"))


@pytest.mark.parametrize("kwargs,field", [
    ({"beta": -0.1}, "beta"),
    ({"beta": float("nan")}, "beta"),
    ({"beta": float("inf")}, "beta"),
    ({"weighting": "example", "epsilon": 0.0}, "epsilon"),
    ({"weighting": "example", "epsilon": -1.0}, "epsilon"),
    ({"weighting": "token", "token_outer": "example", "epsilon": 0.0}, "epsilon"),
    ({"token_alpha": -0.01}, "token_alpha"),
    ({"token_alpha": 1.01}, "token_alpha"),
    ({"weighting": "ratio"}, "weighting"),
    ({"lambda_jsd": -1.0}, "lambda_jsd"),
    ({"free_bits": -0.5}, "free_bits"),
    ({"free_bits_mode": "per_example"}, "free_bits"),
    ({"free_bits_mode": "per_batch", "free_bits": 1.0}, "free_bits_mode"),
    ({"token_outer": "distribution"}, "token_outer"),
    ({"token_outer": "plain", "weighting": "token"}, "token_outer"),
    ({"beta_schedule": "linear"}, "beta_warmup_steps"),
    ({"beta_schedule": "cyclical", "beta_cycle_steps": 1}, "beta_cycle_steps"),
    ({"beta_schedule": "sigmoid"}, "beta_schedule"),
    ({"beta_warmup_steps": 1.5}, "beta_warmup_steps"),
    ({"c_base_source": "oracle"}, "c_base_source"),
])
def test_objective_config_rejects_bad_input_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        ObjectiveConfig(**kwargs)


def test_unknown_weighting_message_lists_valid_ones():
    with pytest.raises(ValueError) as e:
        ObjectiveConfig(weighting="ratio")
    for valid in ("plain", "distribution", "example", "token"):
        assert f"'{valid}'" in str(e.value)


def test_valid_objective_configs_and_their_needs():
    assert not ObjectiveConfig().needs_c_base and not ObjectiveConfig().needs_example_b
    assert ObjectiveConfig(weighting="distribution").needs_c_base
    assert ObjectiveConfig(weighting="example", epsilon=0.1).needs_example_b
    tok = ObjectiveConfig(weighting="token", token_outer="distribution", token_alpha=0.0)
    assert tok.needs_c_base and tok.needs_example_b
    ObjectiveConfig(beta=0, free_bits=0.5, free_bits_mode="batch_mean", beta_schedule="cyclical", beta_cycle_steps=2)


@pytest.mark.parametrize("cls,kwargs,field", [
    (ModelConfig, {"n_latent": 1}, "n_latent"),
    (ModelConfig, {"posterior_features": "cls"}, "posterior_features"),
    (OptimConfig, {"steps": 0}, "steps"),
    (OptimConfig, {"lr_new": -1e-3}, "lr_new"),
    (OptimConfig, {"eval_rows": -1}, "eval_rows"),
    (TrainConfig, {"data_dir": ""}, "data_dir"),
])
def test_other_configs_reject_bad_input_naming_the_field(cls, kwargs, field):
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        cls(**kwargs)


train_configs = st.builds(
    TrainConfig,
    data_dir=st.sampled_from(["data/synth/default", "runs/x"]),
    objective=st.one_of(
        st.builds(ObjectiveConfig, weighting=st.sampled_from(["plain", "distribution"]), beta=st.floats(0, 10),
                  lambda_jsd=st.floats(0, 1), token_alpha=st.floats(0, 1)),
        st.builds(ObjectiveConfig, weighting=st.just("example"), epsilon=st.floats(1e-4, 1.0),
                  beta_schedule=st.just("linear"), beta_warmup_steps=st.integers(1, 1000)),
        st.builds(ObjectiveConfig, weighting=st.just("token"), token_outer=st.just("distribution"),
                  free_bits=st.floats(0.01, 2.0), free_bits_mode=st.sampled_from(["per_example", "batch_mean"])),
    ),
    model=st.builds(ModelConfig, n_latent=st.integers(2, 16)),
    optim=st.builds(OptimConfig, steps=st.integers(1, 10_000), lr_new=st.floats(1e-6, 1e-2), seed=st.integers(0, 99)),
)


@given(cfg=train_configs)
def test_train_config_flat_round_trip(cfg):
    flat = cfg.to_flat()
    assert all(isinstance(v, (str, int, float, bool, list)) for v in flat.values()), flat
    assert TrainConfig.from_flat(flat) == cfg
    assert TrainConfig.from_flat(json.loads(json.dumps(flat))) == cfg  # survives papermill's JSON
    assert set(flat) == set(TrainConfig.flat_fields())


def test_flat_field_names_are_unique_across_sub_configs():
    names = [f.name for cls in TrainConfig._SUB.values() for f in fields(cls)]
    assert len(names) == len(set(names))
    assert len(TrainConfig.flat_fields()) == len(names) + 2


def test_from_flat_with_unknown_key_names_it():
    flat = TrainConfig().to_flat() | {"betaa": 0.5}
    with pytest.raises(ValueError, match="betaa"):
        TrainConfig.from_flat(flat)


def test_from_flat_validates_and_replace_updates():
    with pytest.raises(ValueError, match=r"\bbeta\b"):
        TrainConfig.from_flat({"beta": -1.0})
    cfg = TrainConfig().replace(beta=0.25, weighting="distribution", n_latent=8)
    assert (cfg.objective.beta, cfg.objective.weighting, cfg.model.n_latent) == (0.25, "distribution", 8)
    assert cfg.optim == OptimConfig()


# --- latent_source: one typed parser (zfree.config.LatentSource) behind the stored text form


@given(st.text(min_size=1).filter(lambda k: k.strip()))
def test_latent_source_round_trips_every_label_key(key):
    from zfree.config import LatentSource

    src = LatentSource.oracle(key)
    assert (src.kind, src.label, src.given) == ("label", key, True)
    assert LatentSource.parse(str(src)) == src
    assert str(src) == "label:" + key  # the stored text form, unchanged (run ids hash it)


def test_latent_source_reads_the_posterior_the_control_and_rejects_the_rest():
    from zfree.config import LatentSource

    assert LatentSource.parse("posterior") == LatentSource.parse(None) == LatentSource("posterior")
    assert not LatentSource.parse("posterior").given
    assert LatentSource.parse("control") == LatentSource("control") and LatentSource.parse("control").given
    for bad in ("label:", "label:  ", "Control", "oracle:complete", 3, ""):
        with pytest.raises(ValueError, match="latent_source="):
            LatentSource.parse(bad)
    with pytest.raises(ValueError, match="latent_source="):
        ModelConfig(latent_source="label:")


def test_given_kind_and_run_names_read_the_source_through_the_parser():
    from zfree_lab.experiment.study_folders import given_kind

    assert [given_kind({"latent_source": s}) for s in ("posterior", "control", "label:first_slot", "weird")] \
        == [None, "control", "oracle", "given"]
    assert given_kind({}) is None


def test_a_weighting_set_without_its_epsilon_gets_the_studies_epsilon():
    """``--set weighting=example`` (or token with example outside) without epsilon: 0.05, the value every
    study grid uses; an epsilon given, or one > 0 in the config it overrides, is kept; other choices untouched."""
    from zfree.config import with_default_epsilon
    from zfree.core.weightings import WEIGHTINGS

    assert WEIGHTINGS["example"].grid["epsilon"] == 0.05
    assert with_default_epsilon({"weighting": "example"}) == {"weighting": "example", "epsilon": 0.05}
    assert with_default_epsilon({"token_outer": "example"}, {"weighting": "token", "epsilon": 0.0})["epsilon"] == 0.05
    assert with_default_epsilon({"weighting": "example", "epsilon": 0.0}) == {"weighting": "example", "epsilon": 0.0}
    assert with_default_epsilon({"weighting": "example"}, {"epsilon": 0.2}) == {"weighting": "example"}
    assert with_default_epsilon({"beta": 0.1}, {"weighting": "example", "epsilon": 0.0}) == {"beta": 0.1}
    assert with_default_epsilon({"weighting": "plain"}) == {"weighting": "plain"}


def test_unknown_fields_name_the_closest_known_one():
    from zfree.config import unknown_fields_message

    msg = unknown_fields_message(["betaa", "zzqq"], TrainConfig.flat_fields())
    assert msg.startswith("unknown config fields 'betaa' (did you mean 'beta'?), 'zzqq' (no field has a close name); "
                          f"`zfree train --fields` lists the {len(TrainConfig.flat_fields())} fields")
    assert "lr_new" not in msg


def test_the_fields_added_later_are_the_ones_declared_later():
    """LATER_FIELD_DEFAULTS (left out of a run's identity at their default) holds exactly the fields declared
    with ``later(default)`` (zfree.config.later), at their declared defaults: a new field is one declaration."""
    from zfree.config import LATER_FIELD_DEFAULTS, TrainConfig
    from zfree.config.later import later_defaults

    assert LATER_FIELD_DEFAULTS == later_defaults(*TrainConfig._SUB.values())
    flat = TrainConfig().to_flat()
    assert all(flat[k] == v for k, v in LATER_FIELD_DEFAULTS.items())
