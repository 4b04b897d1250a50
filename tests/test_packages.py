"""A library and an application (issue 57 item 2): ``zfree`` (data, models, objective, reference
scoring, evaluation, training, io, config) never imports ``zfree_lab`` (specs and presets, the
pipeline, executors, results, the report, widgets, the ``zfree`` command), imports without the
application's dependencies (papermill, nbconvert, ipywidgets, submitit, matplotlib, ...), and the
application reads the library through its public names only. Read with ``ast`` where it can; the
import without the application's dependencies in a fresh interpreter that refuses them."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
LIBRARY, LAB = SRC / "zfree", SRC / "zfree_lab"

#: what the application needs and the library must not: the notebook runners, the widgets, the
#: cluster executor, the figures, and the application itself
LAB_ONLY = ("zfree_lab", "papermill", "nbconvert", "nbformat", "nbclient", "jupytext", "ipykernel", "ipywidgets",
            "submitit", "matplotlib", "psutil", "jupyter_client", "jupyterlab", "jupyter_server")


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def library_modules() -> list[str]:
    return sorted(module_name(p) for p in LIBRARY.rglob("*.py"))


def lab_imports(source: str, filename: str) -> list[str]:
    """``file:line: ...`` for every import of zfree_lab in ``source``: ``import zfree_lab(.x)``,
    ``from zfree_lab(.x) import y``, and a string naming it given to ``importlib.import_module`` or
    ``__import__`` (anywhere: top level, a function, ``if TYPE_CHECKING``)."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if func in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                names = [node.args[0].value]
        bad += [f"{filename}:{node.lineno}: imports {n}" for n in names if n.split(".")[0] == "zfree_lab"]
    return bad


def private_library_names(source: str, filename: str) -> list[str]:
    """``file:line: ...`` for every private library name (a part starting with ``_``, dunders aside)
    that ``source`` imports: ``from zfree.a import _b``, ``import zfree._a``, ``from zfree._a import b``."""
    bad = []

    def private(name: str) -> bool:
        return any(p.startswith("_") and not p.startswith("__") for p in name.split("."))

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "zfree":
            bad += [f"{filename}:{node.lineno}: {node.module}.{a.name}" for a in node.names
                    if private(f"{node.module}.{a.name}")]
        elif isinstance(node, ast.Import):
            bad += [f"{filename}:{node.lineno}: {a.name}" for a in node.names
                    if a.name.split(".")[0] == "zfree" and private(a.name)]
    return bad


def test_the_library_never_imports_the_application():
    files = sorted(LIBRARY.rglob("*.py"))
    assert len(files) > 40, len(files)  # the library is found (59 modules in December 2026)
    bad = [b for p in files for b in lab_imports(p.read_text(encoding="utf-8"), str(p.relative_to(SRC.parent)))]
    assert not bad, "\n".join(bad)


def test_the_checks_catch_planted_imports():
    planted = ("import torch\nimport zfree_lab\nfrom zfree_lab.experiment.spec import run_id\n"
               "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import zfree_lab.report.plotting as P\n"
               "def f():\n    import importlib\n    return importlib.import_module('zfree_lab.cli')\n"
               "from zfree.core.io import read_json\nimport zfree_labs\n")
    bad = lab_imports(planted, "x.py")
    assert [b.split(":")[1] for b in bad] == ["2", "3", "6", "9"], bad
    privates = private_library_names("from zfree.models.head_chunks import _grad_scheme, set_head_chunk\n"
                                     "from zfree import __version__\nimport zfree._hidden\n"
                                     "from zfree_lab.report.x import _y\n", "y.py")
    assert privates == ["y.py:1: zfree.models.head_chunks._grad_scheme", "y.py:3: zfree._hidden"], privates


def test_the_application_uses_the_library_through_its_public_names():
    """A library name starting with ``_`` is the library's own business: the application never imports one."""
    files = sorted(LAB.rglob("*.py"))
    assert len(files) > 40, len(files)
    bad = [b for p in files for b in private_library_names(p.read_text(encoding="utf-8"), str(p.relative_to(SRC.parent)))]
    assert not bad, "\n".join(bad)


#: a fresh interpreter whose import system cannot see ``LAB_ONLY`` (as if none were installed), then
#: every library module imported; it prints the failures, and the refused names something asked for
_IMPORT_WITHOUT = """
import importlib, sys
BLOCKED = {blocked!r}
asked = set()

class Hide:
    # one of the interpreter's finders, blind to BLOCKED: an import raises ModuleNotFoundError and
    # importlib.util.find_spec returns None, exactly as for a package that is not installed
    def __init__(self, inner):
        self.inner = inner

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            asked.add(name.split(".")[0])
            return None
        return self.inner.find_spec(name, path, target)

    def __getattr__(self, attr):  # find_distributions (importlib.metadata), invalidate_caches: the finder's own
        return getattr(self.inner, attr)

sys.meta_path[:] = [Hide(f) for f in sys.meta_path]
bad = []
for m in {modules!r}:
    try:
        importlib.import_module(m)
    except Exception as e:
        bad.append(f"{{m}}: {{type(e).__name__}}: {{e}}")
loaded = sorted(k for k in sys.modules if k.split(".")[0] in BLOCKED)
print("FAILED", bad)
print("LOADED", loaded)
print("ASKED", sorted(asked))
sys.exit(1 if bad or loaded else 0)
"""


def test_the_library_imports_without_the_applications_dependencies():
    """Every module of src/zfree imports in an interpreter where papermill, nbconvert, ipywidgets,
    submitit, matplotlib (``LAB_ONLY``) and zfree_lab itself cannot be imported; none of them is loaded
    afterwards. (An optional import the library guards, such as tqdm's notebook bar trying
    ipywidgets, may ask and fall back.)"""
    script = _IMPORT_WITHOUT.format(blocked=set(LAB_ONLY), modules=library_modules())
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
                            "PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg"})
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "FAILED []" in r.stdout and "LOADED []" in r.stdout, r.stdout


def test_the_refusing_interpreter_does_refuse():
    """The same script with zfree_lab allowed, asked for an application module that needs matplotlib,
    fails on matplotlib: the refusal is real."""
    script = _IMPORT_WITHOUT.format(blocked=set(LAB_ONLY) - {"zfree_lab"},
                                    modules=["zfree.core.errors", "zfree_lab.report.figstyle"])
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 1 and "zfree_lab.report.figstyle: ModuleNotFoundError" in r.stdout, r.stdout + r.stderr
    assert "'matplotlib" in r.stdout and "ASKED ['matplotlib']" in r.stdout, r.stdout


def test_the_wheel_ships_both_packages_and_the_command_is_the_applications():
    """pyproject.toml: the ``zfree`` command is ``zfree_lab.cli:main`` (it resolves), and setuptools
    finds every package under src/ (no include or exclude list that could leave one out); the wheel
    built from it holds ``zfree`` and ``zfree_lab`` (the slow tier's tests/test_wheel.py installs it)."""
    import importlib
    import tomllib

    meta = tomllib.loads((SRC.parent / "pyproject.toml").read_text(encoding="utf-8"))
    module, _, attr = meta["project"]["scripts"]["zfree"].partition(":")
    assert module == "zfree_lab.cli" and callable(getattr(importlib.import_module(module), attr))
    assert meta["tool"]["setuptools"]["packages"]["find"] == {"where": ["src"]}
    packages = sorted(module_name(p.parent / "__init__.py") for p in SRC.rglob("__init__.py"))
    assert {"zfree", "zfree_lab", "zfree.train", "zfree_lab.experiment"} <= set(packages)
    orphans = [p for p in SRC.rglob("*.py") if not (p.parent / "__init__.py").is_file()]
    assert not orphans, orphans  # a module in a folder without __init__.py would not be in the wheel
