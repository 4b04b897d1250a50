"""The layers of src/zfree and src/zfree_lab ("Layers you can see", docs/reference/layout.md): each
sub-package is one layer, and a module imports (at the top, inside a function, or under ``if
TYPE_CHECKING``) only modules of its own layer or of a layer below it. Bottom to top, the library
``zfree`` first, then the application ``zfree_lab`` on top of it:

    zfree:     core -> data -> models -> objective -> reference -> evaluate -> train
    zfree_lab: run -> experiment -> report -> cli

Exceptions, on purpose:
  * ``zfree.config`` (the frozen dataclasses, the contract every layer reads; a package whose
    modules hold its sections) may be imported from any layer. Its own imports are checked as if it
    sat on top of ``data``: it builds on core's field checks, and its deprecated
    ``zfree.config.DataConfig`` path reads ``zfree.data.synth``.
  * ``zfree_lab.cli`` (the ``zfree`` command: its parser, its commands) is the top and may import anything.
  * ``zfree`` itself (``__init__``: the version only) counts as core; ``zfree_lab`` itself (its
    ``__init__``: the version, and its folder added to the folders no output may lie in) as experiment.

``models`` sits below ``objective`` because the objective runs the model's forward pass
(``zfree.objective.objectives.step_objective`` under ``zfree.models.precision``'s autocast), and the
one reduction both need, the masked mean token NLL, lives in ``zfree.models.nll``.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "zfree"
LAB = SRC / "zfree_lab"

#: the library's layers and the application's, bottom to top; a module may import its own layer and those before it
LIBRARY_LAYERS = ["core", "data", "models", "objective", "reference", "evaluate", "train"]
LAB_LAYERS = ["run", "experiment", "report", "cli"]
LAYERS = LIBRARY_LAYERS + LAB_LAYERS
RANK = {layer: i for i, layer in enumerate(LAYERS)}
#: the package each layer lives in
PACKAGE_OF = {**{layer: "zfree" for layer in LIBRARY_LAYERS}, **{layer: "zfree_lab" for layer in LAB_LAYERS}}
#: top-level modules that are no sub-package: module -> the layer its own imports are checked at
TOP_LEVEL = {"zfree": "core", "zfree.config": "data", "zfree_lab": "experiment", "zfree_lab.cli": "cli"}
#: importable from every layer (with the modules of that package)
ANYWHERE = {"zfree.config"}


def _ours(name: str) -> bool:
    """True for a module name of the library or the application."""
    return name.split(".")[0] in ("zfree", "zfree_lab")


def layer_of(module: str) -> str | None:
    """The layer of a zfree or zfree_lab module name (``zfree_lab.run.training`` -> ``train``,
    ``zfree_lab.experiment.spec`` -> ``experiment``), None if it has none (or is in the wrong package)."""
    if module in TOP_LEVEL:
        return TOP_LEVEL[module]
    if module.startswith("zfree.config."):  # a section of the config package
        return TOP_LEVEL["zfree.config"]
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and PACKAGE_OF.get(parts[1]) == parts[0] else None


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(module: str, source: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, module) for every zfree or zfree_lab import anywhere in ``source`` (the module ``module``):
    ``import zfree.a.b``, ``from zfree.a.b import x``, ``from zfree.a import b`` (-> ``zfree.a.b``),
    relative imports resolved against ``module``'s package."""
    out = []
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if _ours(a.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not _ours(target):
                continue
            if target in ("zfree", "zfree_lab"):  # from zfree import train, config: each name a module
                out += [(node.lineno, f"{target}.{a.name}" if not a.name.startswith("__") else target)
                        for a in node.names]  # (from zfree import __version__: the package itself)
            else:
                out.append((node.lineno, target))
    return out


def upward_imports(module: str, source: str, filename: str, is_package: bool = False) -> list[str]:
    """``file:line: ...`` for every import in ``source`` of a module above ``module``'s layer (or
    of a zfree module in no layer); empty when the module keeps to its layer and those below."""
    own = layer_of(module)
    if own is None:
        return [f"{filename}:1: {module} is in no layer (LAYERS = {LAYERS})"]
    bad = []
    for line, target in imported_modules(module, source, is_package):
        if target in ANYWHERE or target.rpartition(".")[0] in ANYWHERE or own == "cli":
            continue
        layer = layer_of(target)
        if layer is None:
            bad.append(f"{filename}:{line}: {module} imports {target}, which is in no layer")
        elif RANK[layer] > RANK[own]:
            bad.append(f"{filename}:{line}: {module} (layer {own}) imports {target} (layer {layer}, above it)")
    return bad


def test_every_import_points_down_or_stays_in_its_layer():
    bad, n = [], 0
    for path in sorted([*PKG.rglob("*.py"), *LAB.rglob("*.py")]):
        n += 1
        bad += upward_imports(module_name(path), path.read_text(), str(path.relative_to(SRC.parent)),
                              is_package=path.name == "__init__.py")
    assert n > 100, n
    assert not bad, "\n".join(bad)


def test_the_checker_catches_a_planted_upward_import():
    models_src = ("import torch\n"
                  "from zfree.data.batching import Batch\n"
                  "from zfree.config import TrainConfig\n"
                  "from typing import TYPE_CHECKING\n"
                  "if TYPE_CHECKING:\n"
                  "    from zfree.evaluate.readouts import discrete_readouts\n"
                  "def f():\n"
                  "    from zfree.train.aids import x\n"
                  "    import zfree_lab.report.plotting as P\n"
                  "    from zfree.models import base\n")
    bad = upward_imports("zfree.models.planted", models_src, "src/zfree/models/planted.py")
    assert len(bad) == 3, bad
    assert bad[0].startswith("src/zfree/models/planted.py:6: ") and "zfree.evaluate.readouts (layer evaluate" in bad[0]
    assert bad[1].startswith("src/zfree/models/planted.py:8: ") and "zfree.train.aids (layer train" in bad[1]
    assert bad[2].startswith("src/zfree/models/planted.py:9: ") and "zfree_lab.report.plotting" in bad[2]
    # the same through `from zfree import ...`, a relative import, and into a module of no layer
    assert upward_imports("zfree.core.io", "from zfree import train\n", "io.py") != []
    assert upward_imports("zfree.objective.losses", "from ..train import aids\n", "losses.py") != []
    assert upward_imports("zfree.core.io", "from zfree.nowhere import x\n", "io.py") != []
    # allowed: same layer, below, the config contract from anywhere, anything from the cli
    assert upward_imports("zfree.core.io", "from zfree.core.errors import E\nfrom zfree.config import C\n", "io.py") == []
    assert upward_imports("zfree_lab.cli", "from zfree_lab.report.widgets import W\n", "cli.py") == []
    # the application may import any library layer; the library no layer of the application
    assert upward_imports("zfree_lab.experiment.spec", "from zfree_lab.run.training import t\nimport zfree.core.io\n", "s.py") == []
    assert upward_imports("zfree_lab", "from zfree import __version__\nfrom zfree.core.paths import P\n", "i.py") == []
    assert len(upward_imports("zfree.train.aids", "from zfree_lab.experiment import spec\nimport zfree_lab\n", "t.py")) == 2
    # the lab's layers: a run imports no study, a study may import a run
    assert upward_imports("zfree_lab.run.training", "from zfree_lab.experiment import spec\n", "t.py") != []
    assert upward_imports("zfree_lab.experiment.spec", "from zfree_lab.run import training\n", "s.py") == []
    assert upward_imports("zfree.core.io", "from zfree.experiment.spec import x\n", "io.py") != []  # the old path: no layer
    assert upward_imports("zfree.config", "from zfree.models.base import x\n", "config.py") != []
    # the config package's sections: importable from anywhere, and checked as the package is
    assert upward_imports("zfree.core.io", "from zfree.config.aid import AidConfig\n", "io.py") == []
    assert upward_imports("zfree.config.aid", "from zfree.train.aids import x\n", "aid.py") != []


def test_the_sub_packages_are_the_layers():
    dirs = sorted(p.name for p in PKG.iterdir() if p.is_dir() and not p.name.startswith("__"))
    assert dirs == sorted([*LIBRARY_LAYERS, "config"])  # config: the contract, no layer (module docstring)
    assert sorted(p.name for p in PKG.glob("*.py")) == ["__init__.py"]
    assert sorted(p.name for p in LAB.iterdir() if p.is_dir() and not p.name.startswith("__")) == sorted(LAB_LAYERS)
    assert sorted(p.name for p in LAB.glob("*.py")) == ["__init__.py"]
    for layer in LAYERS:
        doc = ast.get_docstring(ast.parse((SRC / PACKAGE_OF[layer] / layer / "__init__.py").read_text()))
        assert doc, f"{PACKAGE_OF[layer]}/{layer}/__init__.py has no docstring"
