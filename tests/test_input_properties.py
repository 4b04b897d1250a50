"""Property tests of the input boundary (issue 13): on arbitrary text the JSONL loader, the
--set/YAML value parser and the sweep-spec loader return a value or raise an expected zfree
error (one ``zfree: error:`` line in the CLI), never anything else."""

from __future__ import annotations

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zfree.config import TrainConfig, flat_field_types, parse_assignment, parse_field_value
from zfree.core.errors import ConfigError, ZfreeError, one_line
from zfree_lab.cli import is_expected

FIELDS = sorted(flat_field_types())
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
json_like = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                         lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
                         max_leaves=8)


@SETTINGS
@given(name=st.sampled_from(FIELDS), text=st.text(max_size=40))
def test_field_parser_on_any_text_gives_a_typed_value_or_a_config_error(name, text):
    try:
        value = parse_field_value(name, text)
    except ConfigError as e:
        assert name in str(e)
        return
    typ = flat_field_types()[name]
    if typ is int:
        assert isinstance(value, int) and not isinstance(value, bool)
    elif typ is float:
        assert isinstance(value, float)
    else:
        assert isinstance(value, str)


@SETTINGS
@given(text=st.text(max_size=60))
def test_set_assignment_on_any_text(text):
    try:
        name, _ = parse_assignment(text)
    except ConfigError:
        return
    assert name in FIELDS


@SETTINGS
@given(flat=st.dictionaries(st.sampled_from(FIELDS), json_like | st.text(max_size=10), max_size=4))
def test_from_flat_on_any_python_values_is_a_config_or_a_value_error(flat):
    try:
        TrainConfig.from_flat({**TrainConfig().to_flat(), **flat})
    except ValueError as e:  # ConfigError, or a __post_init__ check naming the field
        assert any(k in str(e) for k in (*flat, "free_bits", "epsilon", "beta", "aid", "latent"))


def _expect_zfree_error(e: BaseException, path) -> None:
    assert is_expected(e), repr(e)
    assert isinstance(e, (ZfreeError, FileNotFoundError)), repr(e)
    assert "\n" not in one_line(e) and str(path) in str(e)


@SETTINGS
@given(data=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_jsonl_loader_on_arbitrary_bytes(tmp_path_factory, data):
    from zfree.data.pairs import load_pairs

    f = tmp_path_factory.mktemp("jsonl") / "d.jsonl"
    f.write_bytes(data)
    try:
        pairs = load_pairs(f)
    except Exception as e:  # noqa: BLE001 - the property: only expected errors
        _expect_zfree_error(e, f)
        return
    assert pairs and all(isinstance(p.x, str) and p.y.strip() for p in pairs)


@SETTINGS
@given(rows=st.lists(st.dictionaries(st.sampled_from(["id", "x", "y", "strategy", "bayes_nll"]), json_like, max_size=5),
                     max_size=4))
def test_jsonl_loader_on_arbitrary_json_rows(tmp_path_factory, rows):
    import json

    from zfree.data.pairs import load_pairs

    f = tmp_path_factory.mktemp("jsonl") / "d.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    try:
        load_pairs(f)
    except Exception as e:  # noqa: BLE001
        _expect_zfree_error(e, f)


def _load(tmp_path_factory, text: str):
    from zfree_lab.experiment.sweeps import load_spec

    f = tmp_path_factory.mktemp("spec") / "spec.yaml"
    f.write_text(text)
    try:
        spec = load_spec(f, check_paths=False)
    except Exception as e:  # noqa: BLE001
        _expect_zfree_error(e, f)
        return None
    return spec


@SETTINGS
@given(text=st.text(max_size=120))
def test_spec_loader_on_arbitrary_text(tmp_path_factory, text):
    _load(tmp_path_factory, text)


scalar = st.none() | st.booleans() | st.integers(-3, 10) | st.floats(allow_nan=True) | st.text(max_size=8) \
    | st.sampled_from(["1e-3", "true", "abc", "0", "plain", "token", "cpu"])
axis = st.lists(scalar, min_size=1, max_size=2) | st.fixed_dictionaries(
    {"geomspace": st.lists(scalar, min_size=3, max_size=3)}) | scalar


@SETTINGS
@given(base=st.dictionaries(st.sampled_from(FIELDS), scalar, max_size=3),
       grid=st.dictionaries(st.sampled_from(FIELDS), axis, min_size=1, max_size=2),
       workers=scalar)
def test_spec_loader_on_arbitrary_field_values(tmp_path_factory, base, grid, workers):
    spec = _load(tmp_path_factory, yaml.safe_dump({"base": base, "grid": grid, "workers": workers}))
    if spec is not None:
        assert spec.points() and spec.workers >= 1
