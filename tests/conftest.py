"""Test-wide setup: offline, one thread, modest hypothesis budgets, runtime shape checks.

Runtime checking (STYLE §2): every ``zfree`` module that uses jaxtyping annotations (its source
imports jaxtyping) is imported through ``jaxtyping.install_import_hook`` with beartype, so a
tensor whose shape or dtype contradicts its annotation fails the test that passes it. Modules
without tensor annotations are left alone: beartype would otherwise also enforce unrelated hints
(a non-runtime-checkable Protocol in ``zfree_lab.experiment.executor`` cannot be checked at all), and
``zfree.config`` validates itself in ``__post_init__`` with a ``ValueError`` naming the field,
a contract the hook would pre-empt with a ``TypeError``. ``is_pep484_tower`` lets an int stand
for a float, as Python itself does. Set ZFREE_TYPECHECK=0 to run without the hook.

The hook must be installed before anything imports zfree, hence at the top of this file.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# The suite must not depend on the caller's environment: these are set, not defaulted. Offline and
# one thread; the score cache in a throwaway folder per test process (never the user's ~/.cache or
# an exported ZFREE_CACHE_DIR, whose stale entries would hide a scoring change), with caching on;
# figures on Agg; Jupyter's kernelspecs, runtime files and config from this environment only (a
# user's own "python3" kernelspec could point at another interpreter).
import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

_SCRATCH = tempfile.mkdtemp(prefix="zfree-test-env-")
atexit.register(shutil.rmtree, _SCRATCH, ignore_errors=True)
os.environ.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
                   "ZFREE_CACHE_DIR": os.path.join(_SCRATCH, "score-cache"), "MPLBACKEND": "Agg",
                   "JUPYTER_DATA_DIR": os.path.join(_SCRATCH, "jupyter-data"),
                   "JUPYTER_RUNTIME_DIR": os.path.join(_SCRATCH, "jupyter-runtime"),
                   "JUPYTER_CONFIG_DIR": os.path.join(_SCRATCH, "jupyter-config")})
for _var in ("ZFREE_NO_CACHE", "ZFREE_RUNS", "JUPYTER_PATH", "JUPYTER_CONFIG_PATH", "PYTHONSAFEPATH"):
    os.environ.pop(_var, None)

_SRC = Path(__file__).resolve().parents[1] / "src"
_UNCHECKED = {"zfree", "zfree.config"}


def _checked_modules() -> list[str]:
    mods = []
    for path in [*(_SRC / "zfree").rglob("*.py"), *(_SRC / "zfree_lab").rglob("*.py")]:
        parts = path.relative_to(_SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        text = path.read_text()
        if name not in _UNCHECKED and ("from jaxtyping import" in text or "import jaxtyping" in text):
            mods.append(name)
    return sorted(mods)


if os.environ.get("ZFREE_TYPECHECK", "1") != "0":
    if any(m.startswith(("zfree.", "zfree_lab.")) for m in sys.modules):
        import warnings

        warnings.warn("zfree was imported before tests/conftest.py: runtime shape checks are off", stacklevel=1)
    import jaxtyping

    jaxtyping.install_import_hook(_checked_modules(),
                                  "beartype.beartype(conf=beartype.BeartypeConf(is_pep484_tower=True))")

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

torch.set_num_threads(1)

# explicit profiles, whatever CI variables hypothesis would read: the same examples on every machine
# (derandomize) and no example database written into the clone
settings.register_profile("zfree", max_examples=30, deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=300, deadline=None, database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "zfree"))


#: fixtures that take tens of seconds to build (a study, a sweep, the golden runs) -> their group:
#: under pytest-xdist (``make test``: ``-n 2 --dist loadgroup``) the tests that use one go to one
#: worker, so it is built once, not once per worker. A module-scoped fixture's group is per module.
SHARED_SESSION = {"smoke_study": "smoke_study"}
SHARED_MODULE = {"evil_report": "evil_report", "runs_fp64": "golden", "fp64_root": "golden", "sweep": "sweep",
                 "real": "real", "finished": "finished"}


#: the slowest tests that share no fixture group (``make test``'s --durations, 2 cores), started first:
#: pytest-xdist's loadgroup queue takes the groups by size, then single tests in collection order, and
#: hands one unit to whichever worker is free, so a 100-s test collected late ran alone at the end while
#: the other worker sat idle (issue 33: the default tier took 298-366 s in three fresh clones)
SLOW_FIRST = ("test_own_study.py::test_one_command_from_model_and_jsonl_to_report",
              "test_interrupts.py::test_signal_during_sweep_stops_workers_and_kernels",
              "test_faults.py::test_failing_point_exits_1_with_full_message_and_path",
              "test_faults.py::test_a_sweep_with_a_failed_point_renders_its_report_under_its_own_lock_and_exits_1",
              "test_interrupts.py::test_signal_during_train_is_one_line_and_resumes",
              "test_faults.py::test_sigkill_of_a_sweep_leaves_no_process_behind",
              "test_folder_safety.py::test_a_run_in_a_hostile_folder_runs_nothing_of_it_and_writes_through_no_link",
              "test_leaderboard.py::test_the_report_section_renders_for_a_seeded_remedies_study",
              "test_imports.py::test_every_module_imports_on_its_own",
              "test_sweeps.py::test_failing_point_is_recorded_others_finish_and_rerun_resumes",
              "test_interrupts.py::test_explore_notebook_on_a_missing_folder_says_so")


def _slow_rank(item) -> int:
    """The item's place in ``SLOW_FIRST`` (len(SLOW_FIRST) for every other test)."""
    node = item.nodeid.split("/")[-1].split("[")[0]
    return next((i for i, n in enumerate(SLOW_FIRST) if node == n), len(SLOW_FIRST))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """``@pytest.mark.gpu`` tests are skipped when CUDA is not available; tests sharing an expensive
    fixture are grouped for pytest-xdist (``SHARED_SESSION``, ``SHARED_MODULE``); the slowest single
    tests are moved to the front under pytest-xdist (``SLOW_FIRST``; a stable sort, so every other
    order stays)."""
    if hasattr(config, "workerinput"):  # a pytest-xdist worker (a serial run keeps each module's tests together)
        items.sort(key=_slow_rank)
    for item in items:
        names = getattr(item, "fixturenames", ())
        group = next((g for f, g in SHARED_SESSION.items() if f in names), None) or next(
            (f"{item.module.__name__}::{g}" for f, g in SHARED_MODULE.items() if f in names), None)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (gpu tier)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# ---------------------------------------------------------------------------- shared fixtures
# built once per session (tests/tiny.py); tests deep-copy the models they change


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """(data_dir, base_dir) of the tiny benchmark + base run, built once per session, in the same
    folder as ``tests/tiny_sweep.make_tiny_sweep``'s."""
    from tests.tiny import make_tiny_run

    return make_tiny_run(tmp_path_factory.getbasetemp() / "tiny_sweep")


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory):
    """``get(n_layer=2, seed=1, saved=False, pairs=PAIRS) -> (model, tokenizer, batch)``: the tiny
    GPT-2 of ``tests.tiny.tiny_gpt2`` (``saved``: through save_pretrained + load_base) and the padded
    batch of ``pairs``, each variant built once per session."""
    from tests.tiny import PAIRS, pairs_batch, tiny_gpt2

    cache: dict = {}

    def get(n_layer: int = 2, seed: int = 1, saved: bool = False, pairs=PAIRS):
        key = (n_layer, seed, saved)
        if key not in cache:
            folder = tmp_path_factory.mktemp(f"tiny_lm_{n_layer}_{seed}") if saved else None
            cache[key] = tiny_gpt2(n_layer=n_layer, seed=seed, folder=folder)
        model, tok = cache[key]
        return model, tok, pairs_batch(tok, pairs)

    return get


@pytest.fixture(scope="session")
def smoke_study(tmp_path_factory):
    """The smoke preset's study folder, run once per session (tests/smoke_study.py)."""
    from tests.smoke_study import build_smoke_study  # imports zfree: only after the type-check hook above

    return build_smoke_study(tmp_path_factory.mktemp("smoke_study"))
