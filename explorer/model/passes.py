"""The low-level phases of one forward pass, shared by the Session, speculative decoding, the sweeps
and the views inside a step:

    forward(model, input_ids [B, T], cache, attention_mask [B, L]) -> (logits [B, T, V] float32, cache)
    kv_cache_bytes(cache)  -> bytes held by every key/value tensor
    crop_cache(cache, length) -> keep the first `length` positions
    copy_cache(cache)      -> an independent copy
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache

from explorer.model.sharing import model_lock

# --- low-level phases ----------------------------------------------------------------------------


def position_ids(
    input_ids: torch.Tensor, past_len: int, attention_mask: torch.Tensor | None
) -> torch.Tensor:
    """Positions of the fed tokens [B, T]: from the mask with left padding (pads get 0), else past_len + arange."""
    T = input_ids.shape[1]
    if attention_mask is None:
        return torch.arange(past_len, past_len + T, device=input_ids.device).unsqueeze(0)  # [1, T]
    pos = attention_mask.long().cumsum(-1) - 1  # [B, L]
    return pos.clamp_(min=0)[:, -T:]  # [B, T]


def accepts_logits_to_keep(model) -> bool:
    cached = getattr(model, "_explorer_logits_to_keep", None)
    if cached is None:
        cached = "logits_to_keep" in inspect.signature(model.forward).parameters
        model._explorer_logits_to_keep = cached
    return cached


def cache_length(cache) -> int:
    """Positions held by a cache, as an int (a StaticCache answers with a tensor)."""
    return 0 if cache is None else int(cache.get_seq_length())


def forward(
    model,
    input_ids: torch.Tensor,
    cache: DynamicCache | None,
    attention_mask: torch.Tensor | None = None,
    *,
    last_only: bool = False,
    fn=None,
) -> tuple[torch.Tensor, DynamicCache | None]:
    """One forward pass under inference_mode. Returns float32 logits [B, T, V] (or [B, 1, V] with last_only).

    cache=None feeds the whole sequence with no cache; otherwise `input_ids` are the tokens not yet
    in the cache and the cache grows by T. attention_mask [B, L] covers cache + fed tokens (L = past + T);
    positions come from it, so a left-padded batch gives the same logits as each row alone.
    last_only computes the LM head for the last position only (as generate() does). fn, when
    given, is called instead of the model (a torch.compile'd model.forward).
    """
    past = cache_length(cache)
    if attention_mask is not None and attention_mask.shape[1] != past + input_ids.shape[1]:
        raise ValueError(
            f"attention_mask covers {attention_mask.shape[1]} positions but the cache holds {past} "
            f"and {input_ids.shape[1]} are fed"
        )
    kw = {"logits_to_keep": 1} if last_only and accepts_logits_to_keep(model) else {}
    with model_lock(model), torch.inference_mode():  # one forward at a time per model
        out = (fn or model)(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids(input_ids, past, attention_mask),
            cache=cache,
            use_cache=cache is not None,
            **kw,
        )
        logits = out.logits[:, -1:] if last_only else out.logits  # [B, T, V]
        return logits.float(), (out.cache if cache is not None else None)


def kv_cache_bytes(cache: DynamicCache | None) -> int:
    """Bytes held by all key and value tensors of the cache (0 for None or an empty cache)."""
    if cache is None:
        return 0
    total = 0
    for layer in cache.layers:
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                total += t.nbytes  # numel x element size
        if hasattr(layer, "_quantized_keys"):
            total += _quantized_bytes(layer)
    return total


def _quantized_bytes(layer) -> int:
    """A quantized cache layer (transformers' QuantizedCache) keeps its states as (tensor, scale)
    or a backend's tensor in _quantized_keys/_values, beside an unquantised residual window."""
    total = 0
    for name in ("_quantized_keys", "_quantized_values"):
        q = getattr(layer, name, None)
        for t in list(q) if isinstance(q, tuple | list) else [q]:
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


def crop_cache(cache: DynamicCache, length: int) -> DynamicCache:
    """Keep the first `length` cached positions (no recompute). Returns the same cache object."""
    have = cache_length(cache)
    if not isinstance(length, int) or not 0 <= length <= have:
        raise ValueError(f"cannot crop a cache of {have} positions to {length!r}")
    if length < have:
        with torch.inference_mode():
            cache.crop(length - have)  # transformers 5: a negative number = positions to remove
    return cache


def copy_cache(cache: DynamicCache | None) -> DynamicCache | None:
    """An independent copy of the cache (cloned tensors), for fork(); a StaticCache stays static."""
    if cache is None:
        return None
    if not isinstance(cache, DynamicCache):  # StaticCache: same preallocated buffers, cloned
        import copy

        with torch.inference_mode():
            return copy.deepcopy(cache)
    with torch.inference_mode():
        data = [
            (layer.keys.clone(), layer.values.clone())
            for layer in cache.layers
            if getattr(layer, "is_initialized", False)
        ]
    return DynamicCache(data) if data else DynamicCache()
