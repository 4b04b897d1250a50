"""What a key/value cache needs to know of a transformers model, shared by the CVAE decoders'
shared-prefix pass (``zfree.models.injection``) and cached decoding (``zfree.models.base``)."""

from __future__ import annotations

import inspect

#: the forward keyword of the cache: transformers 5 renamed ``past_key_values`` to ``cache``
CACHE_KW = "cache" if "cache" in inspect.signature(__import__("transformers").GPT2Model.forward).parameters \
    else "past_key_values"


def sliding_window_of(config) -> int | None:
    """The shortest sliding window any layer of ``config`` uses, or None (all layers full)."""
    w = getattr(config, "sliding_window", None)
    if not isinstance(w, int) or w <= 0:
        return None
    types = getattr(config, "layer_types", None)
    if types is not None:
        return w if any("sliding" in str(t) for t in types) else None
    return None if getattr(config, "use_sliding_window", True) is False else w
