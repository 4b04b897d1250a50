"""Logits from final hidden states through the model's *own* head path, exactly, on any causal LM.

zfree reads the body's last hidden states (to gather only the y positions, to reuse a prefix
cache, to add latents) and must then turn them into the logits the model itself would give.
Whatever a ``*ForCausalLM.forward`` does between its body and its returned ``logits`` —
final-logit soft-capping (Gemma2/3), multiplying or dividing by a config constant (Cohere
``logit_scale``, Granite ``logits_scaling``), a pre-head multiplier, an lm_head bias, tied or
untied heads — is honoured by construction: ``logits_from_hidden`` calls the model's own
``forward`` with its body swapped for a stub that returns the given hidden states and its output
layer swapped for the same affine map computed in float32. No list of architectures.

``verify_head`` checks the construction once per model against ``model(input_ids).logits`` on a
short probe row; ``zfree.models.loading.load_causal_lm`` refuses a model that fails it, and
``zfree.reference.scoring`` then falls back to the model's full logits.
"""

from __future__ import annotations

import weakref

import torch
from jaxtyping import Float
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary
from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions as _BodyOutput

from zfree.core.errors import ModelLoadError
from zfree.models.precision import acc_dtype

_VERIFIED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> bool (head exact)


class _BodyStub(nn.Module):
    """Stands in for the body: any call returns the hidden states it holds; a submodule lookup
    (e.g. OPT's ``model.decoder``) returns the stub itself, other attributes the real body's."""

    def __init__(self, real: nn.Module, hidden: torch.Tensor):
        super().__init__()
        object.__setattr__(self, "_zf_real", real)
        object.__setattr__(self, "_zf_hidden", hidden)

    def forward(self, *args, **kwargs):
        return _BodyOutput(last_hidden_state=self._zf_hidden)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            pass
        value = getattr(object.__getattribute__(self, "_zf_real"), name)
        return self if isinstance(value, nn.Module) else value


class _HeadStub(nn.Module):
    """The output layer's affine map (weight, optional bias) in float32, also under autocast."""

    def __init__(self, real: nn.Module):
        super().__init__()
        object.__setattr__(self, "_zf_real", real)

    def forward(self, x):
        real = object.__getattribute__(self, "_zf_real")
        bias = getattr(real, "bias", None)
        with torch.autocast(device_type=x.device.type, enabled=False):
            acc = acc_dtype(real.weight.dtype)  # float32 (float64 for a float64 model)
            return torch.nn.functional.linear(x.to(acc), acc_weight(real.weight, acc),
                                              None if bias is None else bias.to(acc))

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "_zf_real"), name)


_ACC_WEIGHTS = WeakIdKeyDictionary()  # frozen half weight -> (its version key, the cast copy); by identity


def acc_weight(w: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """``w`` in ``acc`` (float32 for a bfloat16 / float16 weight). A frozen low-precision weight
    (``requires_grad`` False: a LoRA run's bfloat16 base, ``zfree.models.precision``) is cast once and
    the copy reused while the weight is unchanged (its in-place version counter and storage): the head over a
    49k-128k vocabulary is called once per chunk, and a fresh float32 copy per call cost as much
    memory traffic as the chunk's product. Any other weight: ``w.to(acc)`` (differentiable)."""
    if w.dtype == acc or w.requires_grad:
        return w.to(acc)
    key = (w._version, w.data_ptr(), w.device)  # an in-place update, or new data swapped in, renews it
    hit = _ACC_WEIGHTS.get(w)
    if hit is None or hit[0] != key:
        hit = (key, w.detach().to(acc))
        _ACC_WEIGHTS[w] = hit
    return hit[1]


def _child_name(parent: nn.Module, child: nn.Module, what: str) -> str:
    for name, c in parent.named_children():
        if c is child:
            return name
    raise ValueError(f"{type(parent).__name__}: its {what} is not a direct submodule; zfree cannot call its head path")


def logits_from_hidden(model, hidden: Float[torch.Tensor, "*rows d_model"]) -> Float[torch.Tensor, "*rows vocab"]:
    """The model's own logits for final hidden states ``hidden`` (any leading shape), float32.

    Runs ``model.forward`` with the body replaced by a stub returning ``hidden`` (as one row of
    N = prod(leading) positions) and the output layer by its affine map in float32, so every
    post-processing step of the model's forward applies (module docstring). Differentiable.
    Raises ValueError if the body or the output layer is not a direct submodule of ``model``.
    """
    lead, D = hidden.shape[:-1], hidden.shape[-1]
    h = hidden.reshape(1, -1, D)
    body, out = model.base_model, model.get_output_embeddings()
    if body is model or out is None:
        raise ValueError(f"{type(model).__name__} has no separate body / output layer")
    body_name, head_name = _child_name(model, body, "body"), _child_name(model, out, "output layer")
    dummy = torch.zeros(h.shape[:2], dtype=torch.long, device=h.device)
    setattr(model, body_name, _BodyStub(body, h))
    setattr(model, head_name, _HeadStub(out))
    try:
        logits = model(input_ids=dummy, use_cache=False).logits
    finally:
        setattr(model, body_name, body)
        setattr(model, head_name, out)
    return logits.to(acc_dtype(out.weight.dtype)).reshape(*lead, -1)


def head_is_exact(model, *, refresh: bool = False) -> bool:
    """True when ``logits_from_hidden(model, body(ids))`` equals ``model(ids).logits`` on a probe row
    of 8 fixed pseudo-random tokens (fp32 body: within 1e-4 * max(1, max |logit|); half body:
    0.1 + 0.02 max |logit|, half logits round at ~1e-2 relative). Cached per model; the probe runs
    in eval mode without gradients or autocast and restores the training flag."""
    if not refresh:
        try:
            return _VERIFIED[model]
        except (KeyError, TypeError):
            pass
    param = next(model.parameters())
    V = int(model.get_output_embeddings().weight.shape[0]) if model.get_output_embeddings() is not None else 2
    ids = torch.randint(0, max(1, min(V, int(getattr(model.config, "vocab_size", V) or V))), (1, 8),
                        generator=torch.Generator().manual_seed(0)).to(param.device)
    was = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.autocast(device_type=param.device.type, enabled=False):
            want = model(input_ids=ids, use_cache=False).logits.to(acc_dtype(param.dtype))
            h = model.base_model(input_ids=ids, use_cache=False).last_hidden_state
            got = logits_from_hidden(model, h)
        scale = float(want.abs().max())
        tol = 1e-4 * max(1.0, scale) if param.dtype in (torch.float32, torch.float64) else 0.1 + 0.02 * scale
        ok = got.shape == want.shape and bool(torch.allclose(got, want, atol=tol, rtol=0))
    except (ValueError, TypeError, AttributeError, RuntimeError):
        ok = False
    finally:
        model.train(was)
    try:
        _VERIFIED[model] = ok
    except TypeError:
        pass
    return ok


def verify_head(model, *, name: str = "model") -> None:
    """Raise ``zfree.core.errors.ModelLoadError`` naming ``name`` unless ``head_is_exact(model)``."""
    if not head_is_exact(model):
        raise ModelLoadError(f"{name}: zfree cannot reproduce {type(model).__name__}'s logits from its hidden states "
                             f"(its forward does more than body -> output layer -> post-processing)")


def exact_logits_from_hidden(model, hidden: Float[torch.Tensor, "*rows d_model"]) -> Float[torch.Tensor, "*rows vocab"]:
    """``logits_from_hidden`` after ``verify_head`` (checked once per model); the CVAE decoder and
    greedy decoding use this. Raises ModelLoadError when the head cannot be reproduced."""
    verify_head(model, name=type(model).__name__)
    return logits_from_hidden(model, hidden)
