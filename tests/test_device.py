"""Device placement, host synchronisation, mixed precision and the shared-prefix switch of the
CVAE step (issue 16, item 6), checked on the CPU.

Placement: one training run (steps and evaluations) under ``tests/placement.FactoryRecorder``;
every tensor factory inside a training step must name the model's device, and every op's output
must be on it; evaluation's factories too, except two named host-side statistics that work on
numpy arrays already read to the host. ``test_recorder_catches_a_planted_host_tensor`` plants
the bug this review fixed (``reconstruction_weight`` building w with ``device=None``) and checks
the recorder names it. The same helper runs on CUDA in tests/test_gpu.py.
"""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from placement import FactoryRecorder  # noqa: E402

from tests.tiny import TRAIN_DEFAULTS, poison_loss_at, tiny_flat  # noqa: E402
from zfree.config import TrainConfig  # noqa: E402
from zfree.core.io import read_json  # noqa: E402
from zfree_lab.run import run_folder  # noqa: E402
from zfree_lab.run.run_folder import NonFiniteLossError  # noqa: E402

#: evaluation statistics computed on the host from numpy arrays already read back, by design: the
#: mutual-information estimate, and the prior draws and centroids of the decode metrics (a CPU
#: generator, so the draws do not depend on the device; greedy decoding moves them to the model)
HOST_SIDE = (" gaussian_mutual_information", " GaussianEvaluator.finish", " continuous_decode_metrics")
#: step paths covered: discrete token weighting (base-token matrix, c_base), continuous plain
#: (w without b), hard EM under example weighting with dead-value restarts (usage counts, b)
STEP_CONFIGS = {
    "discrete-token": dict(weighting="token", token_outer="distribution"),
    "continuous-plain": dict(latent_kind="continuous", weighting="plain"),
    "hard-em-example": dict(weighting="example", epsilon=0.1, aid="hard_em_then_soft", restart_dead_every=1,
                            handover_check_every=1, handover_rows=8),
}


@pytest.fixture(scope="module")
def tiny(tiny_run):
    return tiny_run


def _cfg(data, base, **kw) -> TrainConfig:
    return TrainConfig.from_flat(tiny_flat(data, base, **{"steps": 3, "batch_size": 4, "eval_every": 3, "eval_rows": 8,
                                                          "decode_rows": 4,
                                                          "warmup_backbone": TRAIN_DEFAULTS["warmup_backbone"], **kw}))


def record_training(monkeypatch, cfg: TrainConfig, out: Path, device: str) -> tuple[list, list]:
    """Train ``cfg`` with every step (objective, update, log) and evaluation under a
    ``FactoryRecorder(device)``; returns (step problems, evaluation problems)."""
    import zfree_lab.run.training as tr

    step_bad, eval_bad = [], []

    def wrap(fn, sink, outputs):
        def run(*a, **kw):
            with FactoryRecorder(device, check_outputs=outputs) as rec:
                res = fn(*a, **kw)
            sink.extend(rec.bad_factories + rec.bad_outputs)
            return res
        return run

    for name in ("step_objective", "_optimizer_step", "_log_train_terms"):
        monkeypatch.setattr(tr, name, wrap(getattr(tr, name), step_bad, True))
    monkeypatch.setattr(run_folder.FiniteWatch, "add", wrap(run_folder.FiniteWatch.add, step_bad, True))
    monkeypatch.setattr(tr, "evaluate", wrap(tr.evaluate, eval_bad, False))  # evaluation reads results to the host
    tr.train_cvae(cfg, out, progress=False)
    return step_bad, [b for b in eval_bad if not any(h in b[2] for h in HOST_SIDE)]


@pytest.mark.parametrize("name", sorted(STEP_CONFIGS))
def test_training_step_and_evaluation_build_every_tensor_on_the_model_device(tiny, tmp_path, monkeypatch, name):
    data, base = tiny
    step_bad, eval_bad = record_training(monkeypatch, _cfg(data, base, device="cpu", **STEP_CONFIGS[name]),
                                         tmp_path / "run", "cpu")
    assert not step_bad, f"tensors off the model's device in a training step: {step_bad[:5]}"
    assert not eval_bad, f"tensor factories without the model's device in evaluation: {eval_bad[:5]}"


def test_recorder_catches_a_planted_host_tensor(tiny, tmp_path, monkeypatch):
    """The bug this review fixed, planted again: w built without a device (lands on the CPU)."""
    import zfree.objective.losses as losses

    def old_distribution_weight(batch_size, c_base, b, epsilon, dtype, device):
        return torch.full((batch_size,), 1.0 / c_base, dtype=dtype, device=None if b is None else b.device)

    import dataclasses

    from zfree.core.weightings import WEIGHTINGS

    monkeypatch.setitem(WEIGHTINGS, "distribution", dataclasses.replace(WEIGHTINGS["distribution"],
                                                                      weight=old_distribution_weight))
    data, base = tiny
    step_bad, _ = record_training(monkeypatch, _cfg(data, base, device="cpu", weighting="distribution"),
                                  tmp_path / "run", "cpu")
    assert step_bad and all(f == "full" and d is None and where.startswith("zfree/objective/losses.py") and "reconstruction_weight" in where
                            for f, d, where in step_bad), step_bad


def test_device_defaults_to_auto_and_auto_is_a_valid_device():
    from zfree.core.values import check_device
    from zfree.models.loading import pick_device

    assert TrainConfig().optim.device == "auto" and TrainConfig().optim.precision == "fp32"
    check_device("auto")  # no error on any machine
    assert pick_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="precision"):
        TrainConfig().replace(precision="fp16")
    with pytest.raises(ValueError, match="shared_prefix"):
        TrainConfig().replace(shared_prefix="maybe")


# ---------------------------------------------------------------------------- non-finite check without a sync


def test_deferred_non_finite_check_names_the_first_bad_step_and_its_batch(tiny, tmp_path, monkeypatch):
    """As on an accelerator: flags read every 4 steps; a NaN at step 2 stops the run at the step-4
    check, naming step 2, its batch and terms; no checkpoint holds weights updated from it."""
    import zfree.objective.objectives as objectives
    import zfree_lab.run.training as tr
    from safetensors.torch import load_file

    monkeypatch.setattr(run_folder, "FINITE_CHECK_EVERY", {})
    monkeypatch.setattr(run_folder, "FINITE_CHECK_EVERY_ACCELERATOR", 4)
    batches = []
    real_collate = tr.collate
    monkeypatch.setattr(tr, "collate", lambda enc, **kw: batches.append([e.id for e in enc]) or real_collate(enc, **kw))
    poison_loss_at(monkeypatch, 2)
    data, base = tiny
    with pytest.raises(NonFiniteLossError, match="step 2"):
        tr.train_cvae(_cfg(data, base, device="cpu", steps=8, eval_every=8), tmp_path / "run", progress=False)
    err = read_json(tmp_path / "run" / "error.json")
    assert len(batches) == 4  # the run went on to the check at step 4
    assert err["step"] == 2 and err["batch_ids"] == batches[1] and "kl_prior_loss" in err["non_finite_terms"]
    for d in (tmp_path / "run").glob("checkpoint*"):  # only the step-0 checkpoint, finite
        assert all(torch.isfinite(t).all() for t in load_file(str(d / "model.safetensors")).values())


def test_train_terms_are_device_tensors_until_evaluation(tiny):
    """``_log_train_terms`` keeps tensors (no host read per step); ``_host_state`` turns them into
    the floats ``log_dict`` would have summed, bit for bit."""
    import zfree_lab.run.training as tr
    from zfree.objective.objectives import assemble
    from zfree_lab.run.run_setup import TrainState

    g = torch.Generator().manual_seed(0)
    state = TrainState()
    want: dict = {}
    for _ in range(3):
        br = assemble("discrete", TrainConfig().objective, recon=torch.rand(5, 3, generator=g) + 1,
                      target_len=torch.full((5,), 4), q_logits=torch.randn(5, 3, generator=g),
                      p_logits=torch.randn(5, 3, generator=g))
        tr._log_train_terms(state, br)
        for k, v in br.log_dict().items():
            if not k.startswith("loss_contrib"):
                want[k] = want.get(k, 0.0) + v
    assert all(isinstance(v, torch.Tensor) for k, v in state.train_log.items() if k != "_n")
    tr._host_state(state)
    assert {k: v for k, v in state.train_log.items() if k != "_n"} == want and state.train_log["_n"] == 3


HOST_READS = ("item", "cpu", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__")


def record_host_reads(monkeypatch, cfg: TrainConfig, out: Path, device_type: str) -> list[tuple[str, str]]:
    """Train ``cfg`` at the accelerator's cadence of non-finite checks and return the (method,
    zfree frame) of every explicit host read (``HOST_READS``) of a ``device_type`` tensor made by
    zfree's step code after the forward pass: the objective's assembly, the update, the log of
    the terms and the finiteness flags. (The forward pass itself is the model's: transformers'
    mask helpers may read a flag, and boolean-mask gathers synchronise implicitly.)"""
    import zfree.objective.objectives as objectives
    import zfree_lab.run.training as tr
    from placement import _where
    from torch.overrides import TorchFunctionMode

    reads = []

    class Reads(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", "")
            caller = sys._getframe(1).f_code.co_filename
            # torch.optim keeps Adam's step counter on the host unless capturable: its .item() is no sync
            if name in HOST_READS and args and isinstance(args[0], torch.Tensor) \
                    and args[0].device.type == device_type and "/torch/optim/" not in caller:
                reads.append((name, _where()))
            return func(*args, **(kwargs or {}))

    def wrap(fn):
        def run(*a, **kw):
            with Reads():
                return fn(*a, **kw)
        return run

    monkeypatch.setattr(run_folder, "FINITE_CHECK_EVERY", {})  # the accelerator cadence, also on the CPU
    for mod, name in ((tr, "_optimizer_step"), (tr, "_log_train_terms"), (objectives, "assemble")):
        monkeypatch.setattr(mod, name, wrap(getattr(mod, name)))
    monkeypatch.setattr(run_folder.FiniteWatch, "add", wrap(run_folder.FiniteWatch.add))
    tr.train_cvae(cfg, out, progress=False)
    return reads


def test_training_step_makes_no_explicit_host_read(tiny, tmp_path, monkeypatch):
    data, base = tiny
    reads = record_host_reads(monkeypatch, _cfg(data, base, device="cpu", weighting="example", epsilon=0.1,
                                                steps=4, eval_every=4), tmp_path / "run", "cpu")
    assert not reads, reads[:5]


def test_host_read_check_catches_a_planted_item(tiny, tmp_path, monkeypatch):
    """The per-step ``.item()`` logging this review removed, planted again, is caught."""
    import zfree.objective.objectives as objectives

    real = objectives.ObjectiveBreakdown.log_tensors
    monkeypatch.setattr(objectives.ObjectiveBreakdown, "log_tensors",
                        lambda self, prefix="loss/train": {**real(self, prefix), f"{prefix}/total": self.total.item()})
    data, base = tiny
    reads = record_host_reads(monkeypatch, _cfg(data, base, device="cpu", steps=2, eval_every=2),
                              tmp_path / "run", "cpu")
    assert reads and {r for r, _ in reads} == {"item"}, reads[:5]


def zfree_host_reads(fn, device_type: str = "cpu") -> list[tuple[str, str]]:
    """Run ``fn()``; return the (method, zfree frames) of every explicit host read (``HOST_READS``) of a
    ``device_type`` tensor whose caller is zfree's own code (reads inside transformers or torch, e.g. a
    mask helper under the body's forward, are theirs)."""
    from placement import _in_package, _where
    from torch.overrides import TorchFunctionMode

    reads = []

    class Reads(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", "")
            if name in HOST_READS and args and isinstance(args[0], torch.Tensor) \
                    and args[0].device.type == device_type and _in_package(sys._getframe(1).f_code.co_filename):
                reads.append((name, _where()))
            return func(*args, **(kwargs or {}))

    with Reads():
        fn()
    return reads


@pytest.mark.parametrize("name", ["control", "soft-optimal", "hard-optimal", "continuous-mean_y"])
def test_the_whole_step_forward_included_makes_no_explicit_host_read(name, monkeypatch):
    """Issue 56 item 4: the step's forward (the models, the objective's reductions) and backward read
    nothing back to the host in zfree's code; ``test_training_step_makes_no_explicit_host_read`` covers the
    assembly, the update and the logs. What remains is implicit and listed in ``zfree_lab.run.training``'s
    module docstring (boolean-mask gathers of the head's rows; transformers' mask helper)."""
    from test_step_passes import EQUAL, STEPS, _model

    from tests.tiny import tiny_gpt2
    from zfree.data.batching import collate, encode_pair
    from zfree.models.head import verify_head
    from zfree.objective.objectives import step_objective

    import zfree.models.nll as nll

    monkeypatch.setattr(nll, "HOST_CHECK_DEVICES", (), raising=False)  # the accelerator's checks, on the CPU
    base, tok = tiny_gpt2()
    batch = collate([encode_pair(tok, p) for p in EQUAL], pad_id=tok.pad_token_id)
    phase, fields, _ = STEPS[name]
    model, cfg = _model(base, fields)
    verify_head(model.backbone)
    reads = zfree_host_reads(lambda: step_objective(phase, model, batch, cfg, 1, 2.0, None, None).total.backward())
    assert not reads, reads[:5]


# ---------------------------------------------------------------------------- precision


def test_bf16_autocast_runs_the_body_in_bf16_and_the_head_and_losses_in_fp32(tiny):
    from zfree.data.batching import collate, encode_pairs
    from zfree.data.pairs import load_pairs
    from zfree.models.base import load_base
    from zfree.models.precision import body_autocast, model_outputs_fp32
    from zfree_lab.run.run_setup import build_cvae

    data, base = tiny
    backbone, tok = load_base(base / "model", device="cpu")
    batch = collate(encode_pairs(tok, load_pairs(data / "val.jsonl")[:6]), pad_id=0)
    model = build_cvae(TrainConfig(optim=TrainConfig().optim.__class__(device="cpu")), copy.deepcopy(backbone))
    dtypes = []
    hook = model.backbone.base_model.h[0].mlp.c_fc.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    with torch.no_grad():
        ref = model(batch)
        fp32_dtypes, dtypes[:] = list(dtypes), []
        with body_autocast("bf16", "cpu"):
            out = model(batch)
    hook.remove()
    assert set(fp32_dtypes) == {torch.float32} and len(dtypes) >= 2 and set(dtypes) == {torch.bfloat16}
    assert out.target_logprobs.dtype == torch.float32  # the head and log-softmax ran in float32
    out = model_outputs_fp32(out)
    assert out.posterior_logits.dtype == out.prior_logits.dtype == torch.float32
    diff = (out.target_logprobs - ref.target_logprobs).abs().max().item()
    assert diff < 0.05, f"bf16 body moved a token log-prob by {diff} nats"  # the GPU tier's tolerance


def test_bf16_training_on_cpu_is_finite_and_recorded(tiny, tmp_path):
    from zfree.core.io import read_jsonl
    from zfree_lab.run.training import train_cvae

    data, base = tiny
    runs = {p: train_cvae(_cfg(data, base, device="cpu", precision=p, weighting="distribution"), tmp_path / p,
                          progress=False) for p in ("fp32", "bf16")}
    assert runs["bf16"]["precision"] == "bf16" and runs["bf16"]["device"] == "cpu"
    key = "init/loss/val/baseline_normalized_reconstruction_loss"
    assert runs["bf16"][key] == runs["fp32"][key]  # evaluation is not autocast: step 0 identical
    rows = read_jsonl(tmp_path / "bf16" / "metrics.jsonl")
    assert rows[-1]["step"] == 3 and math.isfinite(rows[-1]["loss/train/total"])
    assert abs(runs["bf16"]["loss/val/objective"] - runs["fp32"]["loss/val/objective"]) < 0.05  # 3 steps apart


def test_fp64_reference_mode_runs_weights_heads_and_log_probs_in_float64(tiny):
    """``precision: fp64``: the base loads in float64, the new heads are built in float64, and the
    decoder's log-probs equal the float64 model's own log_softmax(logits) at float64 rounding (the
    step-0 contract, docs/concepts/problem.md#models, held 1e9 times tighter than in float32)."""
    from zfree.data.batching import collate, encode_pairs
    from zfree.data.pairs import load_pairs
    from zfree.models.base import load_base
    from zfree.models.precision import WEIGHT_DTYPES, acc_dtype
    from zfree_lab.run.run_setup import build_cvae

    assert acc_dtype(torch.float64) == torch.float64 and acc_dtype(torch.bfloat16) == acc_dtype(torch.float32) == torch.float32
    data, base = tiny
    backbone, tok = load_base(base / "model", device="cpu", dtype=WEIGHT_DTYPES["fp64"])
    cfg = _cfg(data, base, device="cpu", precision="fp64")
    for kind in ("discrete", "continuous"):
        model = build_cvae(TrainConfig.from_flat({**cfg.to_flat(), "latent_kind": kind}), copy.deepcopy(backbone))
        assert {p.dtype for p in model.parameters()} == {torch.float64}, kind
    model = build_cvae(cfg, copy.deepcopy(backbone)).eval()
    batch = collate(encode_pairs(tok, load_pairs(data / "val.jsonl")[:6]), pad_id=0)
    with torch.no_grad():
        out = model(batch)
        own = torch.log_softmax(backbone(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits, -1)
    assert out.target_logprobs.dtype == torch.float64
    want = own[:, :-1].gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)  # (B, T-1): log p(token t)
    mask = batch.target_mask[:, 1:]
    for k in range(model.n_latent):
        torch.testing.assert_close(out.target_logprobs[:, k, 1:][mask], want[mask], rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------- shared prefix switch


def test_shared_prefix_config_reaches_the_decoder(tiny, monkeypatch):
    import zfree.models.injection as inj
    from zfree.data.batching import collate, encode_pairs
    from zfree.data.pairs import load_pairs
    from zfree.models.base import load_base
    from zfree_lab.run.run_setup import build_cvae

    data, base = tiny
    backbone, tok = load_base(base / "model", device="cpu")
    batch = collate(encode_pairs(tok, load_pairs(data / "val.jsonl")[:6]), pad_id=0)
    calls = []
    real_full = inj.decoder_hidden_full
    import zfree.models.routes as routes

    for mod in (inj, routes):  # the fallback inside decoder_hidden_suffix and the embedding route's own full path
        monkeypatch.setattr(mod, "decoder_hidden_full", lambda *a, **k: calls.append(1) or real_full(*a, **k))
    outs = {}
    for kind in ("discrete", "continuous"):
        for mode in ("auto", "on", "off"):
            cfg = TrainConfig().replace(device="cpu", shared_prefix=mode, latent_kind=kind)
            model = build_cvae(cfg, copy.deepcopy(backbone))
            assert model.shared_prefix_mode == mode and model.shared_prefix == (mode != "off")
            calls.clear()
            with torch.no_grad():
                outs[kind, mode] = model(batch, z=torch.zeros(6, 1, 16)) if kind == "continuous" else model(batch)
            assert bool(calls) == (mode == "off"), (kind, mode)  # "off": the full pass per latent value
        for mode in ("on", "off"):
            torch.testing.assert_close(outs[kind, mode].target_logprobs, outs[kind, "auto"].target_logprobs,
                                       atol=1e-5, rtol=0)


def test_shared_prefix_on_refuses_a_sliding_window_model(tmp_path):
    from test_architectures import build, make_pairs

    from zfree.data.batching import collate, encode_pairs
    from zfree.models.loading import load_causal_lm
    from zfree_lab.run.run_setup import build_cvae

    model, tok = load_causal_lm(build("mistral-window8", tmp_path / "m"), device="cpu", dtype="float32")
    batch = collate(encode_pairs(tok, make_pairs()), pad_id=0)
    cvae = build_cvae(TrainConfig().replace(device="cpu", shared_prefix="on", n_latent=2), model)
    with pytest.raises(ValueError, match="shared_prefix='on'"), torch.no_grad():
        cvae(batch)


def test_the_optimizers_host_step_counts_are_torchs_placement_not_zfrees():
    """AdamW keeps its step counts on the host by design (``placement._TORCH_OPTIM``); on the H200 they
    were the only "host tensors" of a CUDA step. Recorded as if the model were on CUDA (this machine's
    CPU tensors are then all "elsewhere"), the optimizer's own calls pass and a call outside it does not."""
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([p], lr=0.1)
    p.grad = torch.ones(3)
    with FactoryRecorder("cuda") as rec:
        opt.step()
    assert rec.bad_factories == [] and rec.bad_outputs == [] and opt.state[p]["step"].item() == 1.0
    with FactoryRecorder("cuda") as rec:
        torch.zeros(2)
    assert [f for f, _, _ in rec.bad_factories] == ["zeros"]
