"""The final linear decay of the rates (``optim.lr_decay_share``; warm-up, stable, decay): its factor in
closed form, every param group scaled by it, the field's validation, and run ids unchanged at its default."""

from __future__ import annotations

import pytest

from zfree.config import TrainConfig
from zfree_lab.run.run_setup import BACKBONE_GROUP, NEW_GROUP, ROUTER_GROUP, lr_decay_factor, step_rates


def test_no_decay_keeps_every_rate_constant():
    assert [lr_decay_factor(s, 10, 0.0) for s in range(1, 11)] == [1.0] * 10


def test_the_decay_falls_linearly_over_the_last_share_and_never_reaches_zero():
    # 20 % of 10 steps: the last 2 steps at 2/3 and 1/3 of the stable rate
    assert [lr_decay_factor(s, 10, 0.2) for s in range(1, 11)] == pytest.approx([1.0] * 8 + [2 / 3, 1 / 3])
    f = [lr_decay_factor(s, 1800, 0.2) for s in range(1, 1801)]
    assert f[:1440] == [1.0] * 1440 and f[1440] == pytest.approx(360 / 361)
    assert all(a >= b > 0 for a, b in zip(f, f[1:]))
    assert f[-1] == pytest.approx(1 / 361)
    assert lr_decay_factor(5, 5, 0.01) == pytest.approx(0.5)  # a share under one step still decays the last


def test_step_rates_scale_every_group_by_the_decay():
    cfg = TrainConfig().replace(steps=10, warmup_backbone=2, lr_backbone=1e-4, lr_new=1e-2, lr_decay_share=0.2)
    early, last = step_rates(cfg, None, 1, []), step_rates(cfg, None, 10, [])
    assert early == pytest.approx({BACKBONE_GROUP: 5e-5, NEW_GROUP: 1e-2, ROUTER_GROUP: 1e-2})
    assert last == pytest.approx({BACKBONE_GROUP: 1e-4 / 3, NEW_GROUP: 1e-2 / 3, ROUTER_GROUP: 1e-2 / 3})
    flat = TrainConfig().replace(steps=10, warmup_backbone=2, lr_backbone=1e-4, lr_new=1e-2)
    assert step_rates(flat, None, 10, []) == pytest.approx({BACKBONE_GROUP: 1e-4, NEW_GROUP: 1e-2, ROUTER_GROUP: 1e-2})


@pytest.mark.parametrize("bad", [-0.1, 1.5, "a"])
def test_a_share_outside_0_to_1_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="lr_decay_share"):
        TrainConfig().replace(lr_decay_share=bad)


def test_the_default_leaves_run_ids_as_they_were(tmp_path):
    """A config written before the field (no key) and one at its default are the same run; a decay is another."""
    from zfree.config import LATER_FIELD_DEFAULTS
    from zfree.config.identity import run_hash
    assert LATER_FIELD_DEFAULTS["lr_decay_share"] == 0.0
    flat = TrainConfig().replace(steps=10, data_dir=str(tmp_path), base_dir=str(tmp_path)).to_flat()
    before = {k: v for k, v in flat.items() if k != "lr_decay_share"}
    assert run_hash(before) == run_hash(flat)
    assert run_hash({**flat, "lr_decay_share": 0.2}) != run_hash(flat)
