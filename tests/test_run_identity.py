"""A run's identity (zfree.config.identity): the one answer to "is this the same run" that run ids, the
run folder's same-config check and the control lookup share; the ids of existing studies pinned."""

from __future__ import annotations

import os
import shutil

import pytest

from zfree.config import TrainConfig, identity_diff, run_hash, run_identity
from zfree.core.paths import SHIPPED_BASE, SHIPPED_DATA
from zfree_lab.experiment.spec import run_id


def _flat(**kw) -> dict:
    return {**TrainConfig().to_flat(), "data_dir": str(SHIPPED_DATA), "base_dir": str(SHIPPED_BASE), **kw}


@pytest.mark.parametrize("fields, expected", [
    ({}, "plain_beta1_8c51986b"),
    ({"tensorboard": True, "wandb": "offline"}, "plain_beta1_8c51986b"),  # log-only fields: no part of the run
    ({"injection": "memory"}, "plain_beta1_3f09c7bf"),  # a later field away from its default: part of it
    ({"data_dir": "zfree:data/synth/default"}, "plain_beta1_809a8726"),  # a zfree: path stands for itself
    ({"data_dir": "/nonexistent"}, "plain_beta1_e436faee"),  # so does a folder that holds no data
    ({"latent_source": "label:strategy", "n_latent": 3}, "oracle-strategy_plain_deb666b2"),
    ({"weighting": "example", "epsilon": 0.05, "aid": "hard_em_then_soft", "beta": 0.3},
     "example_beta0.3_hard_em_then_soft_ec328be3"),
])
def test_run_ids_of_existing_studies_are_unchanged(fields, expected):
    """The ids the versions before the one identity gave (computed with them): studies resume as they were."""
    assert run_id(_flat(**fields)) == expected


def test_a_copied_data_folder_is_the_same_run_and_another_folder_form_the_same_folder(tmp_path, monkeypatch):
    copy = tmp_path / "data"
    shutil.copytree(SHIPPED_DATA, copy)
    assert run_hash(_flat(data_dir=str(copy))) == run_hash(_flat())  # by what the folder holds
    monkeypatch.chdir(tmp_path)
    cfg = TrainConfig.from_flat(_flat(data_dir="data"))
    resolved = run_identity(cfg, "resolved")
    assert resolved["data_dir"] == os.path.realpath(copy)
    assert run_identity(_flat(data_dir=str(copy)), "resolved") == resolved  # relative and absolute: one folder
    assert run_identity(cfg) == run_identity(cfg.to_flat())  # the nested config or its flat form


def test_identity_leaves_out_logging_and_later_defaults_and_names_what_differs():
    ident = run_identity(_flat(tensorboard=True))
    assert "tensorboard" not in ident and "wandb" not in ident and "injection" not in ident
    assert identity_diff(ident, run_identity(_flat(wandb="offline"))) == []
    assert identity_diff(ident, run_identity(_flat(beta=0.5, injection="mid"))) == ["beta", "injection"]
