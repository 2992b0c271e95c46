"""The third regime's floor: how long this model's forward pass takes when it has almost nothing to do.

A decode step cannot be faster than its memory floor (bytes / peak bandwidth) or its compute floor
(FLOPs / peak FLOP/s), and it cannot be faster than running its operators at all: one Python call
per module, one kernel launch per op, the framework's bookkeeping. That last floor is measured here
on a *skeleton* of the model: the same class and config (same layers, heads, attention
implementation, the same op graph) with every width shrunk to a few values (hidden 8 per head,
MLP 32, vocabulary 256), run through decode steps on this device. Its latency (a low quantile of the
repeats, explorer.costs.noise) is the overhead floor: measured (device, dtype and repeats stated), not modelled.

    regime = the largest of the three floors: "overhead" when the overhead floor exceeds the
             roofline bound (max of the memory and compute floors), else the bound's side.

So a step is overhead-bound when even a weightless copy of the model would take longer than moving
its real bytes would: the bundled models (a few layers of small matrices) are; a 0.5B model at
batch 1, whose 2 GB of weights take far longer to read than its ops take to launch, is not.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from explorer.costs.timing import measure

HEAD_DIM = 8  # the skeleton's per-head width
MLP = 32
VOCAB = 256
_WIDTHS = {  # config attribute -> skeleton value (callable of the config), where present
    "head_dim": lambda c: HEAD_DIM,
    "intermediate_size": lambda c: MLP,
    "n_inner": lambda c: MLP,
    "ffn_dim": lambda c: MLP,
    "vocab_size": lambda c: VOCAB,
}
_FLOORS: dict[tuple, dict[str, Any]] = {}


def _heads(config) -> int:
    for name in ("num_attention_heads", "n_head", "num_heads"):
        if isinstance(getattr(config, name, None), int):
            return getattr(config, name)
    raise ValueError(f"{type(config).__name__} names no attention head count")


def skeleton_config(config):
    """A copy of the config with the same layers and heads and every width shrunk."""
    small = copy.deepcopy(config)
    hidden = _heads(config) * HEAD_DIM
    for name in ("hidden_size", "n_embd", "d_model"):
        if isinstance(getattr(small, name, None), int):
            setattr(small, name, hidden)
    for name, value in _WIDTHS.items():
        if isinstance(getattr(small, name, None), int):
            setattr(small, name, value(small))
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = getattr(small, name, None)
        if isinstance(value, int) and value >= VOCAB or isinstance(value, list):
            setattr(small, name, None if name == "pad_token_id" else 0)
    return small


def _key(model, device) -> tuple:
    c = model.config
    return (
        type(model).__name__,
        c.to_json_string(use_diff=False),
        str(device),
        str(model.dtype),
        torch.get_num_threads(),
    )


def overhead_floor(model, *, repeats: int = 15, warmup: int = 3) -> dict[str, Any]:
    """Measured latency of one decode step of the model's skeleton on the model's device and dtype
    (a low quantile of `repeats` after `warmup`), cached per model config, device, dtype and threads.
    Returns {"floor_s", "repeats", "spread", "noisy", "noisy_reason", "device", "dtype", "method",
    "skeleton"}."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    key = _key(model, device)
    if key in _FLOORS:
        return _FLOORS[key]
    config = skeleton_config(model.config)
    torch.manual_seed(0)
    skeleton = type(model)(config).to(device=device, dtype=model.dtype).eval()
    with torch.inference_mode():
        cache = DynamicCache()
        ids = torch.zeros(1, 2, dtype=torch.long, device=device)
        skeleton(input_ids=ids, cache=cache, use_cache=True)
        one = ids[:, :1]
        timed = measure(
            lambda: skeleton(input_ids=one, cache=cache, use_cache=True),
            device,
            repeats=repeats,
            warmup=warmup,
        )
    params = sum(p.numel() for p in skeleton.parameters())
    _FLOORS[key] = out = {
        "floor_s": timed.estimate,
        "repeats": repeats,
        "spread": timed.spread,
        "noisy": timed.noisy,
        "noisy_reason": timed.reason,
        "device": str(device),
        "dtype": str(model.dtype).replace("torch.", ""),
        "method": f"measured: a low quantile of a skeleton's decode steps ({timed.method})",
        "skeleton": (
            f"{type(model).__name__}, {getattr(config, 'num_hidden_layers', '?')} layers, "
            f"hidden {_heads(config) * HEAD_DIM}, MLP {MLP}, vocab {VOCAB}, {params:,} parameters"
        ),
    }
    return out
