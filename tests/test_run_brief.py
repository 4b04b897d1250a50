"""What ``zfree train`` prints at the end (zfree_lab.report.run_brief): a new user got ~70 metrics as JSON, NaN
among them, and no word on whether z switched on; ``--json`` keeps that for scripts."""

from __future__ import annotations

import json
import math

import pytest

from zfree_lab.report.run_brief import run_brief, use_verdict

SUMMARY = {"steps": 10, "n_latent": 4, "compute/train_wall_s": 11.16, "loss/val/reconstruction_loss": 6.9097,
           "loss/val/zfree_reconstruction_loss": 7.2077, "loss/val/baseline_normalized_reconstruction_loss": 0.9536,
           "loss/val/kl_prior_loss": 0.00282, "loss/val/neg_elbo_nats_per_sequence": 181.4812,
           "readout/marginal_nll": 181.4780, "latent/measured_use_fraction": 0.0,
           "latent/predicted_use_fraction": 0.0833, "latent/mutual_information": 0.00113, "latent/codes_used": 4,
           "readout/use_shuffled": 0.00162, "readout/use_prior": 0.00071, "structure/alignment_nmi": None,
           "latent_used": False}


def test_the_brief_reads_the_summarys_numbers_and_says_whether_z_switched_on():
    lines = run_brief(SUMMARY, "runs/one")
    text = "\n".join(lines)
    assert lines[0] == "run runs/one: 10 steps (11.2 s of training)"
    assert "D 6.910 nats/token against the z-free model's 7.208 on the same rows (rho_recon 0.954)" in text
    assert "rate 0.0028 nats/example; -ELBO 181.481, marginal NLL 181.478 nats/example" in text
    assert "z unused (collapsed), as theory predicts: used on 0% of rows (predicted 8%)" in text
    assert "4 of 4 codes used" in text and "another row's z costs 0.0016 nats/example, z from the prior 0.0007" in text
    assert "runs/one/summary.json" in text and "nan" not in text.lower()
    assert len(lines) <= 8


def test_a_metric_the_run_did_not_compute_reads_as_a_dash_not_nan():
    text = "\n".join(run_brief({"steps": 2}, "r"))
    assert "nan" not in text.lower() and "D – nats/token" in text and "z's use unknown" in text


def test_a_readout_of_float_noise_below_zero_prints_without_a_minus_sign():
    """A collapsed run's readouts are float noise around 0: "another row's z costs -0.0000 nats/example" read as a
    negative cost; one that rounds to a real negative keeps its sign."""
    text = "\n".join(run_brief({**SUMMARY, "readout/use_shuffled": -3e-6, "readout/use_prior": -0.004}, "r"))
    assert "another row's z costs 0.0000 nats/example, z from the prior -0.0040" in text and "-0.0000" not in text


@pytest.mark.parametrize("measured, predicted, says", [
    (0.9, 0.8, "z switched on, as theory predicts"), (0.9, 0.1, "z switched on, where theory predicts no use"),
    (0.0, 0.9, "z unused (collapsed), where theory predicts use"), (0.6, math.nan, "z switched on"),
    (math.nan, 0.9, "z's use unknown")])
def test_use_verdict(measured, predicted, says):
    assert use_verdict(measured, predicted).startswith(says) and (says != "z switched on" or "theory" not in use_verdict(measured, predicted))


def test_json_prints_every_metric_and_the_default_the_brief(capsys):
    from zfree_lab.cli.commands import _print_summary

    _print_summary(SUMMARY, "runs/one", as_json=True)
    printed = json.loads(capsys.readouterr().out)
    assert printed == {k: v for k, v in SUMMARY.items() if "/" in k}
    _print_summary(SUMMARY, "runs/one", as_json=False)
    assert capsys.readouterr().out.splitlines() == run_brief(SUMMARY, "runs/one")
