"""Issue 24: LoRA (exact at step 0, partial checkpoints), gradient accumulation (the same objective),
one checkpoint per finished run, the estimate's arithmetic, memory fitting and budget cuts, the
budget parser, the kernel-death message and the preset catalog."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from zfree.config import TrainConfig
from zfree.core.errors import ConfigError
from zfree.models.base import load_base
from zfree.models.lora import apply_lora, base_state_dict, trainable_tensors
from zfree.train.accumulate import accumulation_problem, check_accumulation
from zfree_lab.run.run_setup import build_cvae
from zfree_lab.run.training import train_cvae
from zfree_lab.experiment import estimate as est
from zfree_lab.experiment.catalog import preset_catalog, preset_help
from zfree_lab.experiment.controls import control_params
from zfree_lab.experiment.memory_watch import died_message
from zfree_lab.experiment.own_study import OWN_PRESETS
from zfree_lab.experiment.spec import Point, expand_grid
from zfree_lab.experiment.study import PRESETS

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"data_dir": str(ROOT / "data/synth/default"), "base_dir": str(ROOT / "data/base/default"), "steps": 2,
         "eval_every": 2, "eval_rows": 8, "decode_rows": 0, "batch_size": 8, "warmup_backbone": 1, "device": "cpu"}


def _cfg(**over) -> TrainConfig:
    return TrainConfig.from_flat({**TrainConfig().to_flat(), **SMALL, **over})


def test_lora_is_exact_at_step_0_and_hash_is_the_base():
    backbone, _ = load_base(ROOT / "data/base/default/model", device="cpu")
    before = {k: v.clone() for k, v in backbone.state_dict().items()}
    ids = torch.randint(0, backbone.config.vocab_size, (2, 9))
    ref = backbone(ids).logits
    names = apply_lora(backbone, 4, 8.0)
    assert names and all("lora_" in n for n in names)
    torch.testing.assert_close(backbone(ids).logits, ref, rtol=0, atol=0)  # B = 0: the same function
    base = base_state_dict(backbone)
    assert base.keys() == before.keys() and all(torch.equal(base[k], before[k]) for k in before)
    assert all(not p.requires_grad for n, p in backbone.named_parameters() if "lora_" not in n)


def test_lora_targets_refused_by_name():
    backbone, _ = load_base(ROOT / "data/base/default/model", device="cpu")
    with pytest.raises(ValueError, match="lora_targets"):
        apply_lora(backbone, 4, 8.0, "no_such_proj")


def test_lora_run_checkpoint_is_partial_and_resumes(tmp_path, tiny_run):
    from tests.tiny import tiny_flat

    data, base = tiny_run  # the session's tiny benchmark (the shipped one encodes 50k rows a run)
    cfg = TrainConfig.from_flat(tiny_flat(data, base, lora_rank=4, steps=4, eval_every=4, lr_backbone=1e-3,
                                          device="cpu"))
    full = train_cvae(cfg, tmp_path / "whole", progress=False)
    part = tmp_path / "part"
    assert train_cvae(cfg, part, progress=False, stop_after=2) == {"stopped_at": 2}
    model = build_cvae(cfg, load_base(Path(cfg.base_dir) / "model", device="cpu")[0])
    saved = json.loads((part / "checkpoint" / "state.json").read_text())
    assert "partial" in json.dumps(saved)
    from safetensors.torch import load_file
    assert set(load_file(str(part / "checkpoint" / "model.safetensors"))) == set(trainable_tensors(model))
    resumed = train_cvae(cfg, part, progress=False)
    assert resumed["loss/val/reconstruction_loss"] == full["loss/val/reconstruction_loss"]
    assert not (part / "checkpoint.prev").exists() and (part / "checkpoint" / "COMPLETE").exists()
    # issue 59 item 5: the finished run keeps only what trains and what is new (adapters, latent
    # embedding, router, posterior), no optimizer moments, no RNG state, no frozen base weight: in
    # every file of its checkpoint; equal, tensor for tensor, to the uninterrupted run's
    from zfree_lab.run.checkpoint_io import load_plain_state, verify_checkpoint_dir
    from zfree_lab.run.checkpoint import load_checkpoint
    from zfree_lab.run.checkpoint_parts import FINISHED_KEY

    own = set(trainable_tensors(model))
    for run in (part, tmp_path / "whole"):
        ck = run / "checkpoint"
        verify_checkpoint_dir(ck)
        tensors = {}
        for f in ck.glob("*.safetensors"):
            tensors.update({f"{f.stem}/{k}": v for k, v in load_file(str(f)).items()})
        assert {k.split("/", 1)[1] for k in tensors if k.startswith("model/")} == own
        assert not [k for k in tensors if not k.startswith("model/")]  # no optimizer or RNG tensor
        state = load_plain_state(ck)
        assert state[FINISHED_KEY]["body"] == "the base's" and "optimizer" not in state and "rng" not in state
    whole = load_file(str(tmp_path / "whole" / "checkpoint" / "model.safetensors"))
    assert all(torch.equal(v, whole[k]) for k, v in load_file(str(part / "checkpoint" / "model.safetensors")).items())
    assert train_cvae(cfg, part, progress=False) == resumed  # a finished run: its summary, nothing trained
    said = []  # its summary.json gone, a finished run's record is no point to resume from: from step 0
    assert load_checkpoint(part, model, torch.optim.SGD(model.parameters(), lr=0.1), np.random.default_rng(0), dict,
                           warn=said.append) is None and "trains again from step 0" in said[0]


@pytest.mark.slow  # a real run (tens of seconds on 2 cores)
@pytest.mark.parametrize("over", [{}, {"weighting": "example", "epsilon": 0.05, "aid": "hard_em_then_soft",
                                       "hard_em_max_steps": 2, "handover_check_every": 1}], ids=["plain", "hard_em_example"])
def test_micro_batch_is_the_same_objective(tmp_path, over):
    a = train_cvae(_cfg(**over), tmp_path / "a", progress=False)
    b = train_cvae(_cfg(micro_batch=3, **over), tmp_path / "b", progress=False)
    for k in ("loss/val/reconstruction_loss", "loss/val/kl_prior_loss"):
        assert b[k] == pytest.approx(a[k], rel=1e-5, abs=1e-7)


def test_micro_batch_refused_where_it_changes_the_objective():
    cfg = _cfg(free_bits=0.5, free_bits_mode="batch_mean", micro_batch=2)
    assert accumulation_problem(cfg) is not None
    with pytest.raises(ConfigError, match="micro_batch"):
        check_accumulation(cfg)
    assert accumulation_problem(_cfg(weighting="distribution", aid="hard_em_then_soft")) is None
    # the hard phase's batch-mean rescaling of example weights: exact with the step's mean (test_objectives)
    check_accumulation(_cfg(weighting="example", epsilon=0.05, aid="hard_em_then_soft", micro_batch=2))


@pytest.mark.slow  # a real run (tens of seconds on 2 cores)
def test_keep_prev_checkpoint(tmp_path):
    train_cvae(_cfg(keep_prev_checkpoint=True), tmp_path / "k", progress=False)
    assert (tmp_path / "k" / "checkpoint.prev").is_dir()


PROBE = est.Probe(setup_s=10.0, step_s=1.0, eval_row_s=0.1, peak_rss=2 * est.GB, batch_size=8)


def _points(**train):
    return expand_grid({**TrainConfig().to_flat(), **SMALL, **train}, {"beta": [0.1, 0.2, 0.3]})


def test_run_and_grid_seconds():
    p = _points(steps=10, eval_every=5, eval_rows=20)
    # setup 10 + kernel start + 10 steps x 1 s + 3 evaluations x 20 rows x 0.1 s
    one = 26.0 + est.KERNEL_START_S
    assert est.run_seconds(p[0].params, PROBE, n_val=1000) == pytest.approx(one)
    assert est.grid_seconds(p, PROBE, 1000, workers=2) == pytest.approx(2 * one)  # 3 runs on 2 workers
    assert est.grid_seconds(p, PROBE, 1000, workers=1) == pytest.approx(3 * one)


def test_run_seconds_counts_controls_and_hard_em_steps_by_their_kind():
    """A control's steps and rows at the probe's one-pass times; a hard-EM step = one pass + a third
    of a K-way step; without a control probe a control counts as a K-way run (the old overestimate)."""
    pr = dataclasses.replace(PROBE, given_step_s=0.25, given_eval_row_s=0.02)
    p = _points(steps=10, eval_every=10, eval_rows=20)[0].params
    ctrl = control_params(p)  # eval_every = steps: evaluated at step 0 and the end
    base = 10.0 + est.KERNEL_START_S
    assert est.run_seconds(ctrl, pr, 1000) == pytest.approx(base + 10 * 0.25 + 2 * 20 * 0.02)
    assert est.run_seconds(ctrl, PROBE, 1000) == pytest.approx(base + 10 * 1.0 + 2 * 20 * 0.1)
    aided = {**p, "aid": "hard_em_then_soft", "hard_em_max_steps": 4, "handover_check_every": 2, "handover_rows": 30}
    # 4 hard steps x (0.25 + 1/3) + 6 K-way steps + 2 evaluations x 20 rows + 2 gate checks x 30 rows
    assert est.run_seconds(aided, pr, 1000) == pytest.approx(base + 4 * (0.25 + 1 / 3) + 6 + (40 + 60) * 0.1)


def test_fit_memory_fewer_workers_then_micro_batch_then_refusal():
    pts = _points()
    w, mb, _, lines = est.fit_memory(pts, PROBE, 2, limit=int(3 * est.GB / est.MEMORY_SHARE), parent=0,
                                     reprobe=lambda m: pytest.fail("no reprobe needed"))
    assert (w, mb) == (1, 0) and "1 worker" in lines[0]
    assert "of the memory free now" in lines[0] and "with --workers 2 resumes on 2" in lines[0]  # how to take more
    small = dataclasses.replace(PROBE, peak_rss=est.GB // 2, micro_batch=2)
    w, mb, pr, lines = est.fit_memory(pts, PROBE, 2, limit=int(1.01 * est.GB / est.MEMORY_SHARE), parent=0,
                                      reprobe=lambda m: small)
    # two micro-batched runs of 0.5 GB fit in 1 GB: both workers kept (the SmolLM2 study ran one)
    assert (w, mb) == (2, 2) and "micro-batches" in lines[0] and "2 worker(s)" in lines[0]
    w, mb, _, _ = est.fit_memory(pts, PROBE, 2, limit=int(0.7 * est.GB / est.MEMORY_SHARE), parent=0,
                                 reprobe=lambda m: small)
    assert (w, mb) == (1, 2)
    with pytest.raises(ConfigError, match="needs .* GB for one run"):
        est.fit_memory(pts, PROBE, 2, limit=int(0.1 * est.GB), parent=0, reprobe=lambda m: PROBE)


def test_fit_memory_reprobes_a_probe_stopped_at_its_ceiling_and_refuses_when_the_micro_batch_is_too():
    """A probe killed at the memory ceiling (``over``: its peak a lower bound, its times NaN) never
    fits, whatever its peak says; the micro-batch probe decides, and a stopped one is refused."""
    nan = float("nan")
    stopped = dataclasses.replace(PROBE, peak_rss=est.GB // 4, over=True, step_s=nan, setup_s=nan, eval_row_s=nan)
    small = dataclasses.replace(PROBE, peak_rss=est.GB // 2, micro_batch=2)
    seen = []
    w, mb, pr, lines = est.fit_memory(_points(), stopped, 2, limit=int(1.01 * est.GB / est.MEMORY_SHARE), parent=0,
                                      reprobe=lambda m: seen.append(m) or small)
    assert (w, mb, pr) == (2, 2, small) and seen == [2] and "its probe stopped there" in lines[0]
    with pytest.raises(ConfigError, match=r"needs more than 0\.2 GB for one run \(a 4-step probe at micro_batch=2 was "
                                          r"stopped there\) but 1\.0 GB"):
        est.fit_memory(_points(), stopped, 2, limit=int(est.GB / est.MEMORY_SHARE), parent=0,
                       reprobe=lambda m: dataclasses.replace(stopped, micro_batch=m))


def test_a_probe_past_its_memory_ceiling_is_killed_and_says_so(tmp_path):
    """The child (interpreter + torch import: well over 64 MB) is killed when its tree passes the
    ceiling, long before it trains; the Probe records it instead of raising."""
    p = Point("probe", TrainConfig.from_flat({**TrainConfig().to_flat(), **SMALL}).to_flat())
    t0 = time.time()
    pr = est.probe(p, tmp_path, ceiling=64 * 2**20)
    assert pr.over and pr.peak_rss > 64 * 2**20 and math.isnan(pr.step_s)
    assert not (tmp_path / "probe-mb0" / "summary.json").exists() and time.time() - t0 < 60


def test_a_micro_batched_point_is_probed_one_chunk_a_step():
    """micro_batch 2 of batch 8: the probe trains batches of 2 (the accumulated step's peak memory,
    a quarter of its time) and run_seconds scales its step back to the batch of 8."""
    flat = {**TrainConfig().to_flat(), **SMALL, "batch_size": 8}
    assert {k: est.probe_params(flat, 2)[k] for k in ("batch_size", "micro_batch")} == {"batch_size": 2, "micro_batch": 0}
    assert {k: est.probe_params(flat, 0)[k] for k in ("batch_size", "micro_batch")} == {"batch_size": 8, "micro_batch": 0}
    assert est.probe_params(flat, 8)["batch_size"] == 8
    pr = dataclasses.replace(PROBE, batch_size=2, micro_batch=2, setup_s=0.0, eval_row_s=0.0)
    run = {**flat, "steps": 10, "eval_every": 10, "eval_rows": 1, "decode_rows": 0, "micro_batch": 2}
    assert est.run_seconds(run, pr, 100) == pytest.approx(est.KERNEL_START_S + 10 * 4 * PROBE.step_s)


def test_an_interrupt_during_a_probe_takes_its_child_along(tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM while the study waits on its probe: the probe's ``zfree train`` child is
    killed, not left training (a SmolLM2 probe kept running at 22 GB after its study had exited)."""
    import subprocess

    import psutil

    seen = []

    def interrupted(self, *a, **k):
        seen.append(self.pid)
        time.sleep(0.5)
        raise KeyboardInterrupt
    monkeypatch.setattr(subprocess.Popen, "communicate", interrupted)
    p = Point("probe", TrainConfig.from_flat({**TrainConfig().to_flat(), **SMALL}).to_flat())
    with pytest.raises(KeyboardInterrupt):
        est.probe(p, tmp_path)
    assert seen and not psutil.pid_exists(seen[0])


def test_fit_budget_cuts_and_refuses():
    spec = OWN_PRESETS["own"]

    def evals(s):  # 3 evaluations, 2 once the intermediate ones are cut
        return 2 if s.train.get("eval_every", 1) >= s.train["steps"] else 3

    def seconds(s):  # 1 s a step, 0.15 s an evaluated row an evaluation, 2 betas x 4 weightings x 2 aids
        g = s.boundary
        per = s.train["steps"] + 0.15 * s.train["eval_rows"] * evals(s)
        return len(g.weightings) * len(g.beta_factors) * len(g.aids) * per
    cut, lines = est.fit_budget(spec, seconds, budget=600)
    assert seconds(cut) <= 600 and lines[0].startswith("evaluated rows 300 -> 100")
    assert lines[1] == "evaluations at step 0 and the end only"
    assert cut.train["eval_every"] == cut.train["steps"] and cut.boundary.aided["eval_every"] == cut.boundary.aided["steps"]
    assert any("beta points" in l for l in lines) and any(l.startswith("steps x") for l in lines)
    # 8 runs x (200 f + 30) <= 600 needs 200 f = 45 < STEP_FLOOR: the weightings go first, then steps
    assert lines[3] == ("weightings ['plain', 'distribution', 'example', 'token'] -> ['distribution', 'example'] "
                        "(at 50 steps the grid needs 10.7 min, 10.0 are left)")
    assert cut.boundary.weightings == ("distribution", "example") and cut.train["steps"] >= est.STEP_FLOOR
    assert not any(l.startswith("batch") for l in lines)  # 50 steps fit at batch 32

    def batched(s):  # the same grid, a step's time proportional to the batch
        g = s.boundary
        per = s.train["steps"] * s.train.get("batch_size", 32) / 32 + 0.15 * s.train["eval_rows"] * evals(s)
        return len(g.weightings) * len(g.beta_factors) * len(g.aids) * per
    small, lines = est.fit_budget(spec, batched, budget=300)  # 4 runs x (50 + 30) > 300 at batch 32
    assert any(l.startswith("batch 32 -> 8 rows a step") for l in lines) and small.train["batch_size"] == 8
    assert batched(small) <= 300
    roomy, lines = est.fit_budget(spec, seconds, budget=2000)  # 16 runs x (95 + 30) s: steps before the beta cut
    assert cut.boundary.weightings != roomy.boundary.weightings and not any("weightings" in l for l in lines)
    assert roomy.boundary.beta_factors == spec.boundary.beta_factors and lines[-1].startswith("steps x 0.47")
    uncut, none = est.fit_budget(spec, seconds, budget=1e9)
    assert none == [] and uncut == spec
    with pytest.raises(ConfigError, match="even 10 steps") as refused:
        est.fit_budget(spec, seconds, budget=1)
    assert refused.value.smallest_s > 1  # the smallest grid's seconds, for the budget the refusal names
    # a cut that saves nothing is not made: 80 validation rows, so "evaluated rows 300 -> 100" evaluates as many
    few, lines = est.fit_budget(spec, lambda s: seconds(dataclasses.replace(
        s, train={**s.train, "eval_rows": min(80, s.train["eval_rows"])})), budget=600)
    assert not any(l.startswith("evaluated rows") for l in lines) and lines[0] == "evaluations at step 0 and the end only"
    with pytest.raises(ConfigError, match="own-data grid"):
        est.fit_budget(PRESETS["smoke"], seconds, budget=60)


def test_fit_budget_cuts_the_label_oracles_last():
    """Issue 59 item 3: past distribution alone, 50 evaluated rows and steps under the floor come
    before any label oracle; then the oracles to the first label, then none, then a refusal naming
    the time the smallest grid needs and the runs' share of the budget."""
    spec = OWN_PRESETS["own"]

    def seconds(s):  # 1 s a step, 0.1 s an evaluated row; the CVAE runs and one run per oracle
        g = s.boundary
        oracles = 3 if s.oracles is None else len(s.oracles)
        per = s.train["steps"] + 0.1 * s.train["eval_rows"] * 3
        return (len(g.weightings) * len(g.beta_factors) * len(g.aids) + oracles) * per
    labels = ["n_sentences", "first_slot", "complete"]
    # 2 runs + 3 oracles at 50 rows: 5 x (11 + 15) <= 130, every oracle kept at 11 steps
    cut, lines = est.fit_budget(spec, seconds, budget=130, labels=labels)
    assert cut.oracles is None and cut.train["eval_rows"] == 50 and cut.train["steps"] == 11 and seconds(cut) <= 130
    assert [l.split(" (at ")[0] for l in lines] == [
        "evaluated rows 300 -> 100", "beta points [0.333, 3.0] x beta* -> [0.333] x beta*",
        "weightings ['plain', 'distribution', 'example', 'token'] -> ['distribution', 'example']",
        "weightings ['distribution', 'example'] -> ['distribution']", "evaluated rows 100 -> 50",
        "steps x 0.06 (unaided 200 -> 11, aided 400 -> 22; under the 50-step floor)"]
    cut, lines = est.fit_budget(spec, seconds, budget=80, labels=labels)
    assert lines[-2] == ("label oracles ['n_sentences', 'first_slot', 'complete'] -> ['n_sentences'] (at 10 steps the "
                         "grid needs 2.1 min, 1.3 are left)") and lines[-1].startswith("steps x")
    assert cut.oracles == ("n_sentences",) and seconds(cut) <= 80 and cut.train["steps"] >= 10
    # then no oracle at all (each run keeps its control): 2 runs x (15 + 15) s
    cut, lines = est.fit_budget(spec, seconds, budget=60, labels=labels)
    assert lines[-2].startswith("label oracles ['n_sentences'] -> none") and lines[-1].startswith("steps x"), lines
    assert cut.oracles == () and seconds(cut) <= 60 and cut.controls and cut.train["steps"] >= 10
    with pytest.raises(ConfigError, match=r"even 10 steps a run need about 1 min on this machine, 0\.5 min are left"):
        est.fit_budget(spec, seconds, budget=30, labels=labels)
    uncut, _ = est.fit_budget(spec, seconds, budget=1e9, labels=labels)
    assert uncut.oracles is None  # nothing cut where it fits


def _cost_model(setup, per_row_step, eval_row):
    """A stand-in grid cost: per run setup + steps x (0.3 + per_row_step x batch) + evaluated rows x
    evaluations x eval_row; CVAE runs unaided and aided (its own steps), one control each, and one
    oracle per label (3 unless cut)."""
    def seconds(s):
        g = s.boundary
        oracles = 3 if s.oracles is None else len(s.oracles)
        evals = 2 if s.train.get("eval_every", 1) >= s.train["steps"] else 3

        def run(steps):
            return setup + steps * (0.3 + per_row_step * s.train.get("batch_size", 32)) + \
                eval_row * s.train["eval_rows"] * evals
        cvae = len(g.weightings) * len(g.beta_factors)
        return cvae * (run(s.train["steps"]) + run(g.aided.get("steps", s.train["steps"]))) + \
            (cvae + oracles) * run(s.train["steps"])
    return seconds


def _table_row(line: str, labels) -> int:
    """The index in CUTS of the cut that wrote ``line`` (a steps fit: -1)."""
    from zfree_lab.experiment.budget import CUTS, KEEP_WEIGHTINGS

    names = [c.name for c in CUTS]
    head = line.split(" (at ")[0]
    if head.startswith("steps x"):
        return -1
    if head.startswith("evaluated rows"):
        return names.index("50 evaluated rows" if head.endswith("-> 50") else "evaluated rows")
    if head.startswith("evaluations"):
        return names.index("intermediate evaluations")
    if head.startswith("beta points"):
        return names.index("beta points")
    if head.startswith("weightings"):
        return names.index("weightings" if head.endswith(str(list(KEEP_WEIGHTINGS))) else "distribution alone")
    if head.startswith("batch"):
        return names.index("batch")
    if head.startswith("label oracles"):
        return names.index("no label oracle" if head.endswith("-> none") else "one label oracle")
    raise AssertionError(f"no table row wrote {line!r}")


@pytest.mark.parametrize("cost", [(60, 0.05, 0.1), (600, 0.05, 0.1), (30, 0.5, 1.0), (300, 0.2, 0.02)],
                         ids=["balanced", "setup-heavy", "step-heavy", "large-model"])
def test_the_cut_order_follows_the_table_and_the_grid_fills_the_budget(cost):
    """Issue 59 item 3, over budgets from the smallest grid's to the whole grid's (stand-in costs):
    the cuts come in the table's order (a steps fit last); the grid fills at least FILL (85 %) of
    the budget unless it runs at its asked steps and rows (nothing left to buy); steps go under the
    floor only with one beta point and the kept weightings; and a label oracle is cut only where
    the grid with every oracle does not fit even at MIN_STEPS."""
    from zfree_lab.experiment.budget import FILL, KEEP_WEIGHTINGS, MIN_STEPS, _at_steps

    spec, labels = OWN_PRESETS["own"], ["n_sentences", "first_slot", "complete"]
    seconds = _cost_model(*cost)
    fitted = 0
    for budget in np.geomspace(seconds(spec) / 200, seconds(spec), 80):
        try:
            cut, lines = est.fit_budget(spec, seconds, budget, labels)
        except ConfigError:
            continue
        fitted += 1
        rows = [_table_row(l, labels) for l in lines]
        discrete = [r for r in rows if r >= 0]
        assert discrete == sorted(set(discrete)) and -1 not in rows[:-1], lines
        used = seconds(cut) / budget
        asked = cut.train["steps"] == spec.train["steps"] and cut.train["eval_rows"] == spec.train["eval_rows"]
        assert used <= 1 and (used >= FILL or asked), (budget, used, lines)
        if cut.train["steps"] < est.STEP_FLOOR:
            assert len(cut.boundary.beta_factors) == 1 and set(cut.boundary.weightings) <= set(KEEP_WEIGHTINGS), lines
        if cut.oracles is not None:
            every = dataclasses.replace(cut, oracles=None)
            assert seconds(_at_steps(every, MIN_STEPS) or every) > budget, lines
    assert fitted > 40


def test_plan_gives_the_grid_what_is_left_of_the_budget(tmp_path, monkeypatch):
    """The budget is the whole study's: the grid gets it minus the time since the study began (split,
    reference, probes) and the report's REPORT_S; nothing left is a one-line refusal."""
    monkeypatch.setattr(est, "probe", lambda point, work, micro_batch=None, ceiling=None, deadline=None: PROBE)
    monkeypatch.setattr(est, "memory_limit", lambda: 64 * est.GB)
    spec, seen = OWN_PRESETS["own"], []

    def fit(s, seconds, budget, labels=()):
        seen.append(budget)
        if budget < 600:
            refusal = ConfigError("even 10 steps a run need about 30 min on this machine, 8.3 min are left for the runs")
            refusal.smallest_s = 1790.0
            raise refusal
        return s, []
    monkeypatch.setattr(est, "fit_budget", fit)
    now = time.time()
    monkeypatch.setattr(est.time, "time", lambda: now)  # a stopped clock: the arithmetic below is exact on any machine
    t0 = now - 100
    plan = est.plan(spec, lambda s: _points(), tmp_path, workers=1, budget=1200, started=t0)
    assert seen[0] == 1200 - 100 - est.REPORT_S
    assert plan.record["grid_budget_s"] == seen[0] and "for the runs after the preparation" in plan.lines[1]
    # the training rows' scoring is named only where a point of the final grid needs b on them
    monkeypatch.setattr(est, "train_scoring_seconds", lambda points: 580.0)
    plain = est.plan(spec, lambda s: _points(), tmp_path, workers=1)
    assert "scoring the training rows" not in plain.lines[0]
    example = est.plan(spec, lambda s: _points(weighting="example", epsilon=0.05), tmp_path, workers=1)
    assert "scoring the training rows once 580 s" in example.lines[0]
    with pytest.raises(ConfigError, match="--budget 2 min: the split, reference and probes took"):
        est.plan(spec, lambda s: _points(), tmp_path, workers=1, budget=120, started=t0)
    # the grid's refusal names the whole budget, what the preparation took and the runs' share
    # ... and the budget that would hold the smallest grid: 100 s + PLAN_S + 60 s for the report + 1790 s, rounded up
    with pytest.raises(ConfigError, match=r"^--budget 11 min: the split, reference and probes took 1\.7 min and the "
                                          r"report needs about 1; even 10 steps .* 8\.3 min are left for the runs; "
                                          r"give a budget of at least 33 min \(the probes are kept"):
        est.plan(spec, lambda s: _points(), tmp_path, workers=1, budget=660, started=t0)


def test_workers_are_planned_again_after_the_budget_cuts_the_batch(tmp_path, monkeypatch):
    """Issue 35 item 5: memory fixed 1 worker at batch 32's peak; the budget then cut the batch to 8,
    whose probe leaves room for 2: the grid runs on 2 workers (a core no longer idles)."""
    probed = []

    def probe(point, work, micro_batch=None, ceiling=None, deadline=None):
        b = point.params["batch_size"]
        probed.append(b)
        return dataclasses.replace(PROBE, peak_rss=(12 if b == 32 else 3) * est.GB, batch_size=b)
    monkeypatch.setattr(est, "probe", probe)
    monkeypatch.setattr(est, "memory_limit", lambda: 24 * est.GB)  # 0.8 x 24 GB: one run of 12 GB, several of 3
    spec = OWN_PRESETS["own"]
    monkeypatch.setattr(est, "fit_budget", lambda s, seconds, budget, labels=(): (
        dataclasses.replace(s, train={**s.train, "batch_size": 8}), ["batch 32 -> 8 rows a step"]))

    def points(s):
        return _points(batch_size=s.train.get("batch_size", 32))
    plan = est.plan(spec, points, tmp_path, workers=2, budget=3600, started=time.time())
    assert probed[0] == 32 and probed[-1] == 8 and plan.workers == 2
    assert any(l.startswith("memory: 2 worker(s) after the cut to batch 8") for l in plan.lines), plan.lines
    uncut = est.plan(spec, lambda s: _points(batch_size=32), tmp_path, workers=2)  # no cut: one worker, no probe at 8
    assert uncut.workers == 1 and probed.count(8) == 1


@pytest.mark.parametrize("text,seconds", [("15m", 900), ("1h", 3600), ("1h30m", 5400), ("90s", 90), ("20", 1200),
                                          ("none", None), (None, None)])
def test_parse_budget(text, seconds):
    assert est.parse_budget(text) == seconds


def test_parse_budget_refuses():
    with pytest.raises(ConfigError, match="--budget"):
        est.parse_budget("soon")


@pytest.mark.parametrize("text", ["0", "0m", "0h0m", "0.0", " 0 "])
def test_a_zero_budget_is_refused_in_one_line_however_written(text, tmp_path, capsys):
    """``--budget 0`` was "no budget" (a whole grid started without a word) while ``0m`` was refused:
    every zero is refused up front, before the model or data are read (issue 61); none means no budget."""
    with pytest.raises(ConfigError, match=r"^--budget '[^']*': a zero budget fits no run; give a duration such as "
                                          r"15m, 1h.* or none \(no budget\)$"):
        est.parse_budget(text)
    from zfree_lab.cli import main

    (tmp_path / "no-model").mkdir(exist_ok=True)  # a model folder (a missing or empty one is refused first); never loaded
    (tmp_path / "no-model" / "config.json").write_text("{}")
    (tmp_path / "d.jsonl").write_text('{"x": "a", "y": "b"}\n')
    assert main(["study", "--model", str(tmp_path / "no-model"), "--data", str(tmp_path / "d.jsonl"),
                 "--out", str(tmp_path / "out"), "--budget", text]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("zfree: error: --budget") and not (tmp_path / "out").exists(), err


def test_died_message_names_memory():
    class DeadKernelError(RuntimeError):
        pass
    msg = died_message(DeadKernelError("Kernel died"), 3 * est.GB)
    assert "peak RSS 3.00 GB" in msg and "memory" in msg
    assert died_message(ValueError("bad"), 0) is None


def test_catalog_lists_every_preset_with_its_runs():
    names = {**PRESETS, **OWN_PRESETS}
    catalog = preset_catalog()
    assert set(catalog) == set(names)
    for name, spec in PRESETS.items():
        assert catalog[name].runs == len(spec.points()), name
    for name, spec in OWN_PRESETS.items():
        g, per_seed = spec.boundary, len(spec.seeds or (0,))
        points = (math.prod(len(v) for v in spec.grid.values()) if g is None  # a preset of grid arms alone
                  else len(g.weightings) * len(g.beta_factors) * len(g.aids) + len(g.extra))
        assert catalog[name].runs == points * per_seed, name
    assert all(n in preset_help() for n in names)


@pytest.mark.slow  # a real run (tens of seconds on 2 cores)
def test_probe_measures_a_real_run(tmp_path):
    p = Point("probe", TrainConfig.from_flat({**TrainConfig().to_flat(), **SMALL}).to_flat())
    pr = est.probe(p, tmp_path)
    assert pr.step_s > 0 and pr.eval_row_s > 0 and pr.peak_rss > 50 * 2**20 and pr.batch_size == 8
    assert (tmp_path / "probe-mb0" / "summary.json").exists() and not list((tmp_path / "probe-mb0").glob("checkpoint*"))


@pytest.mark.parametrize("remedy", __import__("zfree.objective.remedies", fromlist=["REMEDIES"]).REMEDIES)
def test_probe_config_of_every_remedy_point_is_valid(remedy):
    """A probe trains 3 steps of the first point: a remedy's fields depend on the run's steps and may
    set an aid, so the probe's config drops the remedy name (the leaderboard preset's first point,
    switch_on, failed its probe with "remedy='switch_on' sets aid=... but the config has aid='none'")."""
    from zfree.objective.remedies import apply_remedy, check_remedy_fields

    flat = apply_remedy({**TrainConfig().to_flat(), **SMALL, "steps": 300}, remedy)
    check_remedy_fields(TrainConfig.from_flat(flat))  # the point itself is valid
    cfg = TrainConfig.from_flat(est.probe_params(flat))
    check_remedy_fields(cfg)  # and so is what the probe trains
    assert cfg.optim.steps == est.PROBE_STEPS and cfg.aid.aid == "none" and cfg.aid.remedy == "none"


def test_run_seconds_counts_aggressive_encoder_steps_by_their_measured_cost():
    p = _points(steps=10, eval_every=10, eval_rows=20)[0].params
    plain = est.run_seconds(p, PROBE, 1000)
    aggressive = est.run_seconds({**p, "aid": "aggressive_encoder"}, PROBE, 1000)
    # 10 K-way steps of 1 s each, counted AGGRESSIVE_STEP_FACTOR times
    assert aggressive - plain == pytest.approx(10 * 1.0 * (est.AGGRESSIVE_STEP_FACTOR - 1))


def test_probe_separates_the_first_step_from_the_steady_ones():
    """Steady step = (steps' wall - first step) / (PROBE_STEPS - 1); the first step's extra goes to
    setup (paid once a run); an older summary without the keys falls back to the whole-wall formula."""
    n = est.PROBE_STEPS
    steady, warm = est.probed_step_seconds({"compute/first_step_s": 2.5, "compute/train_wall_s": 2.5 + 0.5 * (n - 1)},
                                           ev0=1.0, end=9.0)
    assert steady == pytest.approx(0.5) and warm == pytest.approx(2.0)
    old, none = est.probed_step_seconds({}, ev0=1.0, end=9.0)
    assert old == pytest.approx((9.0 - 2.0) / n) and none == 0.0


def test_probe_decodes_the_runs_share_of_rows():
    """The probe decodes as the run does: the same share of its evaluated rows (task correctness),
    at least one row where the run decodes at all (samples, multi-reference outputs), none otherwise."""
    flat = {**TrainConfig().to_flat(), **SMALL}
    assert est.probe_params({**flat, "eval_rows": 300, "decode_rows": 100})["decode_rows"] == round(est.PROBE_ROWS / 3)
    assert est.probe_params({**flat, "eval_rows": 500, "decode_rows": 3})["decode_rows"] == 1
    assert est.probe_params({**flat, "decode_rows": 0})["decode_rows"] == 0


def test_run_seconds_counts_decoding_per_evaluation_and_once_a_run():
    """Samples in every evaluation, multi-reference outputs once; a control at its own decoding
    seconds; nothing where the run decodes nothing (an own study on E2E rows spent 18-46 s a run
    decoding after its final evaluation that the estimate had left out)."""
    pr = dataclasses.replace(PROBE, given_step_s=0.25, given_eval_row_s=0.02, samples_s=3.0, decode_s=20.0,
                             given_samples_s=1.0, given_decode_s=40.0)
    p = _points(steps=10, eval_every=5, eval_rows=20)[0].params
    quiet = {**p, "decode_rows": 0}
    assert est.run_seconds({**p, "decode_rows": 3}, pr, 1000) - est.run_seconds(quiet, pr, 1000) == pytest.approx(3 * 3.0 + 20.0)
    ctrl = control_params({**p, "decode_rows": 3})  # evaluated at step 0 and the end
    assert est.run_seconds(ctrl, pr, 1000) - est.run_seconds({**ctrl, "decode_rows": 0}, pr, 1000) == pytest.approx(2 * 1.0 + 40.0)


def test_an_oracles_evaluated_row_costs_the_k_way_rows_time_per_value_times_its_values():
    """A label oracle (or its null) over n values scores every value for each evaluated row: at the
    K-way probe's row time per value x n, never below the control's row (SmolLM2 on a 7-valued label,
    2026-12-05: 1.29-1.33 s a row, estimated at the control's 0.345 s before). The control keeps its
    own row time, and a probe that does not know its K (a record kept by an older zfree) changes nothing."""
    from zfree_lab.experiment.controls import null_params, oracle_params

    pr = dataclasses.replace(PROBE, given_step_s=0.25, given_eval_row_s=0.02, eval_row_s=0.4, n_latent=4)
    p = _points(steps=10, eval_every=5, eval_rows=20)[0].params  # 3 evaluations x 20 rows
    ctrl = control_params(p)
    rows = 2 * 20  # a control or oracle: evaluated at step 0 and the end
    base = est.run_seconds(ctrl, pr, 1000)
    for given in (oracle_params(p, "food", 7), null_params(p, "food", 7)):
        assert est.run_seconds(given, pr, 1000) - base == pytest.approx(rows * (0.4 * 7 / 4 - 0.02))
    two = oracle_params(p, "yes_no", 2)  # 0.4 x 2 / 4 = 0.2 s a row
    assert est.run_seconds(two, pr, 1000) - base == pytest.approx(rows * (0.2 - 0.02))
    old = dataclasses.replace(pr, n_latent=0)
    assert est.run_seconds(oracle_params(p, "food", 7), old, 1000) == pytest.approx(est.run_seconds(ctrl, old, 1000))


def test_fit_budget_drops_example_when_its_fixed_cost_does_not_fit():
    """Example weighting scores the training rows once (with SmolLM2 on 4193 E2E rows, ~27 min):
    where even STEP_FLOOR steps at the small batch do not fit with it, distribution is kept alone."""
    spec = OWN_PRESETS["own"]

    def seconds(s):  # as above, with a one-off for example weighting
        g = s.boundary
        per = s.train["steps"] * s.train.get("batch_size", 32) / 32 + 0.1 * s.train["eval_rows"] * 3
        return len(g.weightings) * len(g.beta_factors) * len(g.aids) * per + one_off * ("example" in g.weightings)
    one_off = 900
    cut, lines = est.fit_budget(spec, seconds, budget=600)
    assert any(l.startswith("weightings ['distribution', 'example'] -> ['distribution']") for l in lines)
    assert cut.boundary.weightings == ("distribution",) and seconds(cut) <= 600
    # a small one-off where 10 steps still fit with both: both kept, at fewer steps
    one_off = 20
    kept, lines = est.fit_budget(spec, seconds, budget=300)
    assert kept.boundary.weightings == ("distribution", "example") and seconds(kept) <= 300
    assert not any(l.endswith("-> ['distribution']") for l in lines)


def test_grid_seconds_counts_the_training_rows_scoring_once_per_overlap():
    """The first example point scores the training rows (then cached); one starting on the other
    worker before that is done scores them too; later ones read the cache; plain points never."""
    pr = dataclasses.replace(PROBE, train_scoring_s=100.0)
    flat = {**TrainConfig().to_flat(), **SMALL, "steps": 10, "eval_every": 10, "eval_rows": 20}
    plain = Point("p", {**flat, "weighting": "plain"})
    ex = [Point(f"e{i}", {**flat, "weighting": "example", "epsilon": 0.05}) for i in range(3)]
    one = est.run_seconds(plain.params, pr, 1000)
    assert est.grid_seconds([plain, plain], pr, 1000, workers=2) == pytest.approx(one)
    # two example points side by side both score; the third starts after the cache is written
    assert est.grid_seconds(ex, pr, 1000, workers=2) == pytest.approx(2 * one + 100.0)
    assert est.grid_seconds(ex[:1], pr, 1000, workers=1) == pytest.approx(one + 100.0)


def test_train_scoring_seconds_from_the_preparations_rate(tmp_path):
    (tmp_path / "base" / "reference").mkdir(parents=True)
    (tmp_path / "base" / "reference" / "reference.json").write_text(json.dumps({"scoring_s": 50.0, "n_rows": 100}))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text('{"x": "a", "y": "b"}\n' * 400)
    flat = {**TrainConfig().to_flat(), **SMALL, "base_dir": str(tmp_path / "base"), "data_dir": str(tmp_path / "data")}
    assert est.train_scoring_seconds([Point("e", {**flat, "weighting": "example", "epsilon": 0.05})]) == pytest.approx(200.0)
    assert est.train_scoring_seconds([Point("d", {**flat, "weighting": "distribution"})]) == 0.0
    (tmp_path / "base" / "reference" / "reference.json").write_text(json.dumps({"n_rows": 100}))  # no rate recorded
    assert est.train_scoring_seconds([Point("e", {**flat, "weighting": "example", "epsilon": 0.05})]) == 0.0


def test_the_budget_help_is_the_cut_table():
    """--budget's help lists the cuts of zfree_lab.experiment.budget.CUTS in their order (generated)."""
    from zfree_lab.cli.parser import build_parser
    from zfree_lab.experiment.budget import CUTS, budget_help

    names = budget_help().split(", ")
    assert names[:4] == ["evaluated rows", "intermediate evaluations", f"steps (>= {est.STEP_FLOOR})", "beta points"]
    assert names[-3:] == [f"steps (>= {est.MIN_STEPS})", "one label oracle", "no label oracle"]  # the oracles last
    assert [n for n in names if not n.startswith("steps")] == [c.name for c in CUTS if c.apply is not None]
    study = build_parser()._subparsers._group_actions[0].choices["study"]
    budget = next(a for a in study._actions if "--budget" in a.option_strings)
    assert budget.help.endswith("cuts in order: " + budget_help())


def _with_a_control(**train):
    pts = _points(**train)
    return [pts[0], Point("control_x", control_params(pts[0].params))]


def test_a_micro_batch_is_probed_beside_its_control(tmp_path, monkeypatch):
    """The full batch's probe passed its ceiling: the K-way point at the micro-batch and the z-free
    control are probed side by side, each within half the ceiling, and the control is not probed
    again; where one passes its half, the K-way point alone with the whole ceiling, then the control."""
    alone, pairs = [], []

    def probe(point, work, micro_batch=None, ceiling=None, deadline=None):
        alone.append((point.run_id, micro_batch, ceiling))
        b = point.params["batch_size"] if not micro_batch else micro_batch
        return dataclasses.replace(PROBE, over=b == 32, peak_rss=(30 if b == 32 else 3) * est.GB, batch_size=b,
                                   wall_s=100.0)

    def side_by_side(jobs, ceiling, deadline=None, over=False):
        pairs.append(([(p.run_id, mb) for p, _, mb in jobs], ceiling))
        return [dataclasses.replace(PROBE, peak_rss=3 * est.GB, batch_size=mb, micro_batch=mb, over=over,
                                    given_step_s=None, step_s=s, wall_s=60.0) for (_, _, mb), s in zip(jobs, (4.0, 2.0))]
    monkeypatch.setattr(est, "probe", probe)
    monkeypatch.setattr(est, "probe_side_by_side", side_by_side)
    monkeypatch.setattr(est, "memory_limit", lambda: 24 * est.GB)
    monkeypatch.setattr(est, "usable_cores", lambda: 2)
    pts = _with_a_control(batch_size=32)
    plan = est.plan(OWN_PRESETS["own"], lambda s: pts, tmp_path, workers=2)
    (ceiling,) = {c for _, _, c in alone}
    assert [a[:2] for a in alone] == [(pts[0].run_id, None)]  # the full batch alone, nothing probed after the pair
    assert pairs and pairs[0] == ([(pts[0].run_id, 8), ("control_x", 8)], ceiling // 2)
    assert plan.record["probe"]["given_step_s"] == pytest.approx(2.0) and plan.record["micro_batch"] == 8
    # the probes' time: the one stopped at its ceiling (100 s) + the pair's elapsed time once (not 60 + 60 s)
    assert 100.0 <= plan.record["probe"]["wall_s"] < 110.0
    # one of the pair passed its half: each alone, with the whole ceiling
    alone.clear()
    monkeypatch.setattr(est, "probe_side_by_side", lambda jobs, c, d=None: side_by_side(jobs, c, over=True))
    est.plan(OWN_PRESETS["own"], lambda s: pts, tmp_path, workers=2)
    assert [a[:2] for a in alone] == [(pts[0].run_id, None), (pts[0].run_id, 8), ("control_x", 8)]
    assert len({c for _, _, c in alone}) == 1  # this plan's ceiling (its parent's RSS may differ by a page)
    # one worker asked for: no pair
    alone.clear(), pairs.clear()
    monkeypatch.setattr(est, "probe_side_by_side", side_by_side)
    est.plan(OWN_PRESETS["own"], lambda s: pts, tmp_path, workers=1)
    assert not pairs and [a[:2] for a in alone] == [(pts[0].run_id, None), (pts[0].run_id, 8), ("control_x", 8)]


def test_probes_side_by_side_run_at_once_and_an_interrupt_takes_both_children(tmp_path, monkeypatch):
    """Both probes run at the same time (each waits at a barrier the other must reach: run one after
    the other, the barrier breaks and the test fails) and come back in the jobs' order; an interrupt
    of the main thread while they run kills both children (here ``sleep`` processes standing in for
    ``zfree train``, registered as a probe registers its child) and is raised again."""
    import os
    import signal
    import subprocess
    import threading

    import psutil

    from zfree_lab.experiment import probe as probe_mod

    pts = _with_a_control()
    barrier = threading.Barrier(2, timeout=30)

    def meeting(point, work, micro_batch=None, ceiling=None, deadline=None):
        barrier.wait()
        return dataclasses.replace(PROBE, wall_s=float(len(point.run_id)), peak_rss=ceiling)
    monkeypatch.setattr(probe_mod, "probe", meeting)
    k, g = est.probe_side_by_side([(pts[0], tmp_path, None), (pts[1], tmp_path / "control", None)], est.GB)
    assert (k.wall_s, g.wall_s, k.peak_rss) == (len(pts[0].run_id), len("control_x"), est.GB)

    children, started = [], threading.Barrier(3, timeout=30)
    before = set(probe_mod._LIVE)  # pids another test of this process left listed are not this test's

    def sleeping(point, work, micro_batch=None, ceiling=None, deadline=None):
        proc = subprocess.Popen(["sleep", "600"])
        probe_mod._LIVE.add(proc.pid)
        children.append(proc)
        started.wait()
        try:
            proc.wait(timeout=20)  # returns at once when the interrupt killed it
        except subprocess.TimeoutExpired:
            pass  # not killed: still running, and the assertion below fails
        probe_mod._LIVE.discard(proc.pid)
        return PROBE
    monkeypatch.setattr(probe_mod, "probe", sleeping)

    def interrupt_once_both_run():  # a real SIGINT, as Ctrl-C sends: it wakes the main thread's wait
        started.wait()
        os.kill(os.getpid(), signal.SIGINT)
    # Python's own Ctrl-C handler: a shell's background job (`make test &`, a CI runner) starts with SIGINT
    # ignored, and the signal would then never reach the main thread
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=interrupt_once_both_run, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            est.probe_side_by_side([(pts[0], tmp_path, None), (pts[1], tmp_path / "control", None)], est.GB)
        assert len(children) == 2 and all(c.poll() is not None for c in children) and not probe_mod._LIVE - before
    finally:
        signal.signal(signal.SIGINT, previous)
        for c in children:
            c.kill()
    assert not any(psutil.pid_exists(c.pid) and psutil.Process(c.pid).status() != psutil.STATUS_ZOMBIE
                   for c in children)


def test_an_interrupt_inside_a_probe_threads_start_still_kills_and_reaps_every_child(tmp_path, monkeypatch):
    """The race CI met: Ctrl-C reaches the main thread while it is still inside the second thread's
    ``start`` (the first thread already runs and has started its child). That child is killed and
    reaped (its thread waited for) before the interrupt is raised again; the second probe, which asks
    for its child only after the interrupt, starts none; and a probe outside that call still may."""
    import subprocess
    import threading

    from zfree_lab.experiment import probe as probe_mod

    pts = _with_a_control()
    children, refused, first_runs = [], [], threading.Barrier(2, timeout=30)  # thread 0 and the main thread

    def sleeping(point, work, micro_batch=None, ceiling=None, deadline=None):
        if point is pts[1]:  # the second probe: asks for its child once its call is stopping
            assert probe_mod._CALL.stop.wait(timeout=20)
            try:
                children.append(probe_mod._start_child(["sleep", "600"], {}))
            except probe_mod.ProbeStopped:
                refused.append(point.run_id)
            return PROBE
        proc = probe_mod._start_child(["sleep", "600"], {})
        children.append(proc)
        first_runs.wait()
        proc.wait(timeout=20)  # returns at once when the interrupt killed it; TimeoutExpired if not
        probe_mod._LIVE.discard(proc.pid)
        return PROBE
    monkeypatch.setattr(probe_mod, "probe", sleeping)

    class CutShort(threading.Thread):
        def start(self):
            super().start()
            if self.name.endswith("-1"):  # as if the interrupt landed in the second start's wait
                first_runs.wait()  # the first probe's child exists
                raise KeyboardInterrupt
    monkeypatch.setattr(probe_mod.threading, "Thread", CutShort)
    try:
        with pytest.raises(KeyboardInterrupt):
            probe_mod.probe_side_by_side([(pts[0], tmp_path, None), (pts[1], tmp_path / "control", None)],
                                         est.GB)
        assert [c.returncode for c in children] == [-9] and refused == [pts[1].run_id] and not probe_mod._LIVE
        later = probe_mod._start_child(["sleep", "600"], {})  # no call is stopping in this thread
        children.append(later)
        assert later.poll() is None
    finally:
        for c in children:
            c.kill()
            c.wait()
        probe_mod._LIVE.clear()


@pytest.mark.slow
def test_two_real_probes_side_by_side_each_measure_their_own_run(tmp_path, monkeypatch):
    """Two real ``zfree train`` probes, both children alive at once (each waits at a barrier in
    ``communicate`` the other must reach), each with its own measurements and run folder."""
    import subprocess
    import threading

    from zfree_lab.experiment import probe as probe_mod

    pts = _with_a_control()
    barrier, original = threading.Barrier(2, timeout=60), subprocess.Popen.communicate

    def together(self, *a, **k):
        barrier.wait()
        return original(self, *a, **k)
    monkeypatch.setattr(subprocess.Popen, "communicate", together)
    k, g = est.probe_side_by_side([(pts[0], tmp_path, None), (pts[1], tmp_path / "control", None)], 8 * est.GB)
    assert not k.over and not g.over and k.step_s > 0 and g.step_s > 0 and not probe_mod._LIVE
    assert (tmp_path / "probe-mb0" / "summary.json").exists()
    assert (tmp_path / "control" / "probe-mb0" / "summary.json").exists()


def test_a_probe_of_the_same_config_on_this_machine_is_kept_not_run_again(tmp_path, monkeypatch):
    """A study refused by its budget and run again with a larger one re-probes nothing: each probe's
    measurement is kept beside it (``probe-mb<m>.measured.json``) and reused for the same config on
    the same machine while it answers for the new ceiling; another config, machine or an older
    record is measured again."""
    import subprocess

    from zfree_lab.experiment import probe as probe_mod

    started = []

    class NoChild:
        def __init__(self, *a, **k):
            started.append(a)
            raise RuntimeError("a child was started")
    p = Point("probe", TrainConfig.from_flat({**TrainConfig().to_flat(), **SMALL}).to_flat())
    run, flat = tmp_path / "probe-mb0", est.probe_params(p.params, 0)
    fitted = dataclasses.replace(PROBE, peak_rss=2 * est.GB, wall_s=30.0, given_step_s=None)
    probe_mod._keep_measured(run, flat, 8 * est.GB, fitted)
    monkeypatch.setattr(subprocess, "Popen", NoChild)
    kept = est.probe(p, tmp_path, ceiling=4 * est.GB)
    assert kept.reused and dataclasses.replace(kept, reused=False) == fitted and kept.given_step_s is None
    with pytest.raises(RuntimeError, match="a child was started"):  # its peak (2 GB) is over the new ceiling
        est.probe(p, tmp_path, ceiling=1 * est.GB)
    other = Point("probe", {**p.params, "lr_new": 3e-3})
    with pytest.raises(RuntimeError, match="a child was started"):  # another config
        est.probe(other, tmp_path, ceiling=4 * est.GB)
    # a probe stopped at 8 GB answers for any ceiling up to 8 GB, not above
    over = est.Probe(setup_s=math.nan, step_s=math.nan, eval_row_s=math.nan, peak_rss=8 * est.GB, batch_size=8,
                     over=True)
    probe_mod._keep_measured(run, flat, 8 * est.GB, over)
    again = est.probe(p, tmp_path, ceiling=6 * est.GB)
    assert again.over and again.reused and math.isnan(again.step_s)
    with pytest.raises(RuntimeError, match="a child was started"):
        est.probe(p, tmp_path, ceiling=12 * est.GB)
    # another machine (or zfree version), or a record older than a day: measured again
    monkeypatch.setattr(probe_mod, "_machine", lambda: {"host": "elsewhere"})
    with pytest.raises(RuntimeError, match="a child was started"):
        est.probe(p, tmp_path, ceiling=6 * est.GB)
    monkeypatch.undo()
    monkeypatch.setattr(subprocess, "Popen", NoChild)
    monkeypatch.setattr(probe_mod.time, "time", lambda: 1e12)
    with pytest.raises(RuntimeError, match="a child was started"):
        est.probe(p, tmp_path, ceiling=6 * est.GB)
    assert len(started) == 5


def test_a_probe_the_models_size_rules_out_is_skipped(tmp_path, monkeypatch):
    """Issue 59 item 2: a probe whose step the model's size alone puts over its ceiling (weights,
    gradients and Adam's moments of the body, the residual stream and MLP activation of B x K x T
    tokens, the logits B x K x T x vocab up to the evaluation's chunk) is not run: it comes back
    skipped, at that floor, in no time; fit_memory then goes to the micro-batch, which is checked too."""
    import subprocess

    from zfree_lab.experiment import memory_floor as cost
    from zfree_lab.run.metrics import EVAL_LOGIT_ELEMENTS

    class NoChild:
        def __init__(self, *a, **k):
            raise RuntimeError("a child was started")
    monkeypatch.setattr(subprocess, "Popen", NoChild)
    p = Point("probe", TrainConfig.from_flat({**TrainConfig().to_flat(), **SMALL, "batch_size": 32}).to_flat())
    size = cost.model_size(ROOT / "data/base/default/model")
    assert (size.vocab, size.d_model, size.n_layer, size.d_mlp) == (15, 128, 2, 512)
    from safetensors.torch import load_file
    weights = load_file(str(ROOT / "data/base/default/model/model.safetensors"))
    assert size.n_params == sum(t.numel() for t in weights.values())
    t = cost.mean_target_tokens(ROOT / "data/base/default")
    floor = cost.step_memory_floor(est.probe_params(p.params))
    tokens = 32 * 4 * t  # batch x K x mean y tokens
    assert floor == int(4 * size.n_params + 12 * size.n_params + 4 * tokens * (128 + 512) * 2
                        + 4 * min(tokens * 15, EVAL_LOGIT_ELEMENTS))
    t0 = time.time()
    skipped = est.probe(p, tmp_path, ceiling=floor - 1)
    assert skipped.skipped and skipped.over and skipped.peak_rss == floor and time.time() - t0 < 5
    assert not (tmp_path / "probe-mb0.measured.json").exists()  # nothing measured, nothing kept
    # the micro-batch of 8 rows needs less: its floor is under the same ceiling, so it would run
    small = cost.step_memory_floor(est.probe_params(p.params, 8))
    assert small < floor - 1
    with pytest.raises(RuntimeError, match="a child was started"):
        est.probe(p, tmp_path, micro_batch=8, ceiling=floor - 1)
    # a model whose size cannot be read without loading it (no config.json: a GGUF file): never skipped
    assert cost.model_size(tmp_path) is None
    assert cost.step_memory_floor({**p.params, "base_dir": str(tmp_path)}) is None
    # in a plan: the full batch is skipped, the micro-batch probed, and the line says why
    seen = []

    def probe(point, work, micro_batch=None, ceiling=None, deadline=None):
        seen.append(micro_batch)
        if micro_batch is None:
            return dataclasses.replace(PROBE, peak_rss=floor, batch_size=32, over=True, skipped=True, wall_s=0.0,
                                       step_s=math.nan, setup_s=math.nan, eval_row_s=math.nan)
        return dataclasses.replace(PROBE, peak_rss=est.GB, batch_size=micro_batch, micro_batch=micro_batch)
    monkeypatch.setattr(est, "probe", probe)
    w, mb, pr, lines = est.fit_memory(_points(batch_size=32), probe(p, tmp_path), 2,
                                      limit=int(2.5 * est.GB / est.MEMORY_SHARE), parent=0,
                                      reprobe=lambda m: probe(p, tmp_path, m))
    assert (w, mb) == (2, 8) and f"at least {floor / est.GB:.1f} GB a run by the model's size (not probed)" in lines[0]


class _Clock:
    """A clock the stand-in probes move: ``time.time()`` of estimate.plan reads it."""

    def __init__(self):
        self.now = 1e9

    def __call__(self):
        return self.now


def _timed_probe(clock, took: dict, kept: set):
    """A stand-in ``probe``: a point first probed takes ``took[kind]`` seconds of the clock (stopped at
    its deadline, as ``_poll_peak`` stops a child), a point probed before is kept (no time)."""
    def probe(point, work, micro_batch=None, ceiling=None, deadline=None):
        kind = _kind(point)
        if kind in kept:
            return dataclasses.replace(PROBE, wall_s=took[kind], reused=True)
        if deadline is not None and clock.now + took[kind] > deadline:
            wall, clock.now = deadline - clock.now, deadline
            return dataclasses.replace(PROBE, wall_s=wall, over_time=True, step_s=math.nan, setup_s=math.nan,
                                       eval_row_s=math.nan)
        clock.now += took[kind]
        kept.add(kind)
        return dataclasses.replace(PROBE, wall_s=took[kind])
    return probe


def _kind(point):
    return "control" if point.params.get("latent_source", "posterior") != "posterior" else "k-way"


def test_probes_take_at_most_their_share_of_the_budget(tmp_path, monkeypatch):
    """Issue 59 item 2: the probes get PROBE_SHARE of the budget. The z-free control's probe, which
    the estimate can do without (its steps counted at the K-way times, an overestimate), is not
    started where the K-way probe's time would pass that share; a K-way probe still running at it is
    stopped and the study refused in one line naming the share."""
    clock = _Clock()
    monkeypatch.setattr(est.time, "time", clock)
    monkeypatch.setattr(est, "memory_limit", lambda: 64 * est.GB)
    monkeypatch.setattr(est, "usable_cores", lambda: 1)
    spec = OWN_PRESETS["own"]
    pts = _with_a_control(steps=10, eval_every=10, eval_rows=20)
    probe = _timed_probe(clock, {"k-way": 300.0, "control": 200.0}, set())
    monkeypatch.setattr(est, "probe", probe)
    t0 = clock.now - 60
    plan = est.plan(spec, lambda s: pts, tmp_path, workers=1, budget=1800, started=t0)  # share: 450 s
    assert clock.now - t0 - 60 <= est.PROBE_SHARE * 1800
    assert any(l.startswith("z-free control not probed (the probes' share of the budget, 25 %") for l in plan.lines)
    assert plan.record["probe"]["given_step_s"] is None  # counted as K-way steps
    assert [r["probe"] for r in plan.record["probes"]] == ["K-way at batch 8"]
    # with a budget whose share holds both, both run
    clock.now += 1000
    monkeypatch.setattr(est, "probe", _timed_probe(clock, {"k-way": 300.0, "control": 200.0}, set()))
    both = est.plan(spec, lambda s: pts, tmp_path, workers=1, budget=3600, started=clock.now - 60)
    assert both.record["probe"]["given_step_s"] is not None and len(both.record["probes"]) == 2
    # a K-way probe longer than the share is stopped there and the study refused
    monkeypatch.setattr(est, "probe", _timed_probe(clock, {"k-way": 600.0, "control": 200.0}, set()))
    start = clock.now
    with pytest.raises(ConfigError, match=r"^--budget 30 min: the probes may take 25 % of it \(7\.5 min\) and were "
                                          r"stopped there"):
        est.plan(spec, lambda s: pts, tmp_path, workers=1, budget=1800, started=start - 60)
    assert clock.now - start == pytest.approx(450.0)


def test_a_refusals_budget_is_the_smallest_the_same_command_accepts(tmp_path, monkeypatch):
    """Issue 59 item 2: a refusal asks for the budget that holds the preparation, the planning with
    its probes kept (they are not run again), the report and the smallest grid; the same command with
    exactly that budget is accepted, with a minute less refused."""
    clock = _Clock()
    monkeypatch.setattr(est.time, "time", clock)
    monkeypatch.setattr(est, "memory_limit", lambda: 64 * est.GB)
    kept: set = set()
    slow = dataclasses.replace(PROBE, setup_s=500.0)  # a large model's start: the smallest grid is 3 x 525 s
    monkeypatch.setattr(est, "PROBE", slow, raising=False)

    def probe(point, work, micro_batch=None, ceiling=None, deadline=None):
        pr = _timed_probe(clock, {"k-way": 300.0}, kept)(point, work, micro_batch, ceiling, deadline)
        return dataclasses.replace(pr, setup_s=slow.setup_s)
    monkeypatch.setattr(est, "probe", probe)
    spec = OWN_PRESETS["own"]

    def points(s):
        return _points(**{k: s.train[k] for k in ("steps", "eval_every", "eval_rows", "batch_size")})

    def attempt(minutes):
        return est.plan(spec, points, tmp_path, workers=1, budget=minutes * 60, started=clock.now - 120)  # 2 min prep
    with pytest.raises(ConfigError) as refused:
        attempt(25)
    import re
    asked = int(re.search(r"give a budget of at least (\d+) min", str(refused.value)).group(1))
    assert kept == {"k-way"}
    with pytest.raises(ConfigError, match="give a budget of at least"):
        attempt(asked - 1)
    plan = attempt(asked)  # accepted, the probe kept
    assert plan.seconds <= plan.record["grid_budget_s"] and plan.record["probes"][0]["status"] == "kept"
    # the advice does not count the probes the first attempt ran: asked again, it is the same
    assert asked == 30


def test_a_probe_past_its_deadline_is_stopped_and_not_kept(tmp_path):
    """The deadline of the probes' share: the child ``zfree train`` (its imports alone take more than
    the second it is given) is killed there; the Probe says so, its times unmeasured, and no record
    is kept (a longer deadline probes it again)."""
    p = Point("probe", TrainConfig.from_flat({**TrainConfig().to_flat(), **SMALL}).to_flat())
    t0 = time.time()
    pr = est.probe(p, tmp_path, ceiling=8 * est.GB, deadline=t0 + 1.0)
    assert pr.over_time and not pr.over and not pr.measured and math.isnan(pr.step_s) and time.time() - t0 < 30
    assert not (tmp_path / "probe-mb0.measured.json").exists()


def test_the_estimate_names_the_probes_it_ran_and_kept_and_times_at_the_grids_batch(tmp_path, monkeypatch):
    """Issue 59 item 4: the K-way probe at batch 32 kept from an earlier attempt, the probe of the
    batch the budget cut to run now: the line says which ran (with this session's seconds) and which
    was kept ("kept" alone would be false), and quotes the step at the grid's batch of 8."""
    clock = _Clock()
    monkeypatch.setattr(est.time, "time", clock)

    def probe(point, work, micro_batch=None, ceiling=None, deadline=None):
        b = point.params["batch_size"]
        if b == 32:  # kept: no time now
            return dataclasses.replace(PROBE, step_s=4.0, peak_rss=12 * est.GB, batch_size=32, wall_s=900.0,
                                       reused=True)
        clock.now += 120.0
        return dataclasses.replace(PROBE, peak_rss=3 * est.GB, batch_size=b, wall_s=120.0)
    monkeypatch.setattr(est, "probe", probe)
    monkeypatch.setattr(est, "memory_limit", lambda: 24 * est.GB)
    monkeypatch.setattr(est, "fit_budget", lambda s, seconds, budget, labels=(): (
        dataclasses.replace(s, train={**s.train, "batch_size": 8}), ["batch 32 -> 8 rows a step"]))
    plan = est.plan(OWN_PRESETS["own"], lambda s: _points(batch_size=s.train.get("batch_size", 32)), tmp_path,
                    workers=2, budget=7200, started=clock.now)
    head = plan.lines[0]
    assert "4-step probes ran now (120 s): K-way at batch 8; kept from an earlier probe of the same config on this " \
           "machine: K-way at batch 32." in head, head
    assert "Measured at the grid's batch of 8 rows (scaled from the probe's 32): 1.00 s a K-way step" in head
    assert plan.record["probes_s"] == 120.0 and [r["status"] for r in plan.record["probes"]] == ["kept", "ran"]
    # nothing run now: said so, and every probe kept
    monkeypatch.setattr(est, "fit_budget", lambda s, seconds, budget, labels=(): (s, []))
    kept = est.plan(OWN_PRESETS["own"], lambda s: _points(batch_size=32), tmp_path, workers=1, budget=7200,
                    started=clock.now)
    assert "4-step probes none ran now; kept from an earlier probe" in kept.lines[0]
    assert "Measured at the grid's batch of 32 rows: 4.00 s a K-way step" in kept.lines[0]


def test_a_probe_reused_from_one_run_side_by_side_this_session_is_not_called_earlier():
    """The log of a SmolLM2 plan (2026-12-05): the control probed beside the K-way micro-batch, then
    reused when the K-way probe ran again alone. It ran now: it is named once, among those run now,
    not also as "kept from an earlier probe"; a probe kept from an earlier session still is."""
    log = [{"probe": "K-way at batch 32", "status": "stopped at its memory ceiling"},
           {"probe": "K-way at batch 8 (side by side)", "status": "stopped at its memory ceiling"},
           {"probe": "z-free control at batch 8 (side by side)", "status": "ran"},
           {"probe": "K-way at batch 8", "status": "ran"},
           {"probe": "z-free control at batch 8", "status": "kept"}]
    said = est.probes_said(log, 285.0)
    assert said == ("4-step probes ran now (285 s): z-free control at batch 8 (side by side), K-way at batch 8; "
                    "stopped at their memory ceiling: K-way at batch 32, K-way at batch 8 (side by side)"), said
    earlier = est.probes_said([*log, {"probe": "K-way at batch 16", "status": "kept"}], 285.0)
    assert earlier == ("4-step probes ran now (285 s): z-free control at batch 8 (side by side), K-way at batch 8; "
                       "kept from an earlier probe of the same config on this machine: K-way at batch 16; "
                       "stopped at their memory ceiling: K-way at batch 32, K-way at batch 8 (side by side)"), earlier
