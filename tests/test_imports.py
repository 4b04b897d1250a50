"""The import graph of src/zfree and src/zfree_lab: every module imports on its own, and no module imports (at the
top or inside a function) one that imports it back, directly or through others (issue 12)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "zfree"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted([*PKG.rglob("*.py"), *(SRC / "zfree_lab").rglob("*.py")]):
        parts = path.relative_to(SRC).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the zfree and zfree_lab modules it imports anywhere in its source (function-level imports included)."""
    mods = _modules()
    graph = {m: set() for m in mods}
    for m, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module
                           for a in node.names]
            else:
                continue
            graph[m] |= {t for t in targets if t in mods and t != m and t not in ("zfree", "zfree_lab")}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of modules (first == last), or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (c := visit(n)):
                return c
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (c := visit(m)):
            return c
    return None


def test_find_cycle_finds_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    assert {"zfree.objective.objectives", "zfree_lab.run.training", "zfree_lab.experiment.results"} <= set(graph)
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_experiment_layer_points_down_only():
    graph = import_graph()
    assert not graph["zfree_lab.experiment.results"] & {"zfree_lab.experiment.study", "zfree_lab.experiment.sweeps",
                                                     "zfree_lab.report.widgets", "zfree_lab.report.plotting"}
    assert "zfree_lab.experiment.study" not in graph["zfree_lab.experiment.sweeps"]
    assert not graph["zfree.objective.losses"] & {"zfree.objective.objectives", "zfree_lab.run.training",
                                                   "zfree_lab.run.metrics"}


def test_every_module_imports_on_its_own():
    """In a fresh interpreter (no test hooks), each module is imported with every zfree and zfree_lab module removed
    from sys.modules first, so none relies on another having been imported before it."""
    script = (
        "import importlib, sys\n"
        f"mods = {sorted(_modules())!r}\n"
        "bad = []\n"
        "for m in mods:\n"
        "    for k in [k for k in sys.modules if k.split('.')[0] in ('zfree', 'zfree_lab')]:\n"
        "        del sys.modules[k]\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "    except Exception as e:\n"
        "        bad.append(f'{m}: {type(e).__name__}: {e}')\n"
        "print('\\n'.join(bad))\n"
        "sys.exit(1 if bad else 0)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
                            "PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg"})
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
