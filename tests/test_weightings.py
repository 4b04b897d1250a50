"""zfree.core.weightings: one registry of reconstruction weightings from which the config, the loss, the
grids, the launch panel, the figures and the budget derive."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import pytest
import torch

from zfree.core.weightings import OUTER_WEIGHTINGS, TOKEN_OUTER_NAMES, WEIGHTING_NAMES, WEIGHTINGS, weight_function

SRC = Path(__file__).resolve().parents[1] / "src" / "zfree"


def test_each_weight_is_its_closed_form():
    b = torch.tensor([0.5, 2.0, 0.0], dtype=torch.float64)
    kw = dict(batch_size=3, c_base=2.5, b=b, epsilon=0.05, dtype=torch.float64, device="cpu")
    assert torch.equal(weight_function("plain")(**kw), torch.ones(3, dtype=torch.float64))
    assert torch.equal(weight_function("none")(**kw), torch.ones(3, dtype=torch.float64))
    assert torch.allclose(weight_function("distribution")(**kw), torch.full((3,), 1 / 2.5, dtype=torch.float64))
    assert torch.allclose(weight_function("example")(**kw), 1 / (b + 0.05))
    with pytest.raises(ValueError, match=re.escape(f"weighting='token' is not one of {list(OUTER_WEIGHTINGS)}")):
        weight_function("token")


def test_every_reader_derives_from_the_registry():
    from zfree.config import TokenOuter, Weighting
    from zfree_lab.experiment.estimate import KEEP_WEIGHTINGS
    from zfree_lab.experiment.spec import WEIGHTINGS as GRID
    from zfree_lab.experiment.study import PRESETS
    from zfree.objective.losses import RECONSTRUCTION_WEIGHTINGS
    from zfree_lab.report.figstyle import WEIGHTING_COLORS, WEIGHTING_FILLS

    assert get_args(Weighting) == WEIGHTING_NAMES == tuple(WEIGHTINGS)
    assert get_args(TokenOuter) == TOKEN_OUTER_NAMES and RECONSTRUCTION_WEIGHTINGS == OUTER_WEIGHTINGS
    assert list(GRID) == list(WEIGHTINGS)
    full = PRESETS["full"].grid["weighting"]  # the full preset's weightings (fixed: its catalog counts its runs)
    assert full == [WEIGHTINGS[p["weighting"]].grid_fields for p in full]
    assert GRID["example"] == {"weighting": "example", "epsilon": 0.05}
    assert set(WEIGHTING_COLORS) == set(WEIGHTING_FILLS) == set(WEIGHTINGS)
    assert len(set(WEIGHTING_COLORS.values())) == len(WEIGHTINGS)  # each weighting its own colour
    assert set(KEEP_WEIGHTINGS) == {n for n, w in WEIGHTINGS.items() if w.kept_by_budget}


def test_each_entry_cites_its_source_and_every_grid_point_is_a_valid_config():
    from zfree.config import TrainConfig

    for name, w in WEIGHTINGS.items():
        assert re.search(r"seed 00\d|\(\w.* \d{4}\)", w.source), name
        TrainConfig.from_flat({**TrainConfig().to_flat(), **w.grid_fields})  # raises on an invalid field


def test_no_module_lists_the_weightings_by_hand():
    """The list of weighting names is written once, in zfree/core/weightings.py."""
    listed = re.compile(r"""["']plain["'],\s*["']distribution["'],\s*["']example["']""")
    offenders = [str(p.relative_to(SRC.parent)) for p in [*SRC.rglob("*.py"), *(SRC.parent / "zfree_lab").rglob("*.py")]
                 if p.relative_to(SRC.parent).as_posix() != "zfree/core/weightings.py" and listed.search(p.read_text())]
    assert offenders == []


def test_reading_the_registry_imports_no_torch():
    """config validation and `zfree --help` read the table; only computing a weight imports torch."""
    import subprocess
    import sys

    code = "import sys, zfree.config, zfree_lab.cli, zfree.core.weightings; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
