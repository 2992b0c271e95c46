"""The newest token's attention over its context, per layer and head.

One extra forward of the newest token alone (on a cache of the L-1 positions before it) with the
model switched to the eager attention implementation for that pass only and scoped hooks on the
attention modules,
so only [layers, heads, L] weights are built (never L x L). Row 0 of a batch. Aggregates: the mean
and the max over heads per layer, and `sink`: the share of attention on the first real token (the
"attention sink" of Xiao et al. 2023), mean over heads, per layer.
"""

from __future__ import annotations

import torch

from explorer.inside.hooks import InsideUnavailable, hooked
from explorer.model.layout import LayoutError, layout
from explorer.model.sharing import model_lock


def _weights_catcher(store: dict[int, torch.Tensor], i: int):
    def post(module, args, output):
        w = output[1] if isinstance(output, tuple) and len(output) > 1 else None
        if isinstance(w, torch.Tensor) and w.dim() == 4:  # [B, heads, T, positions]
            store[i] = w[0, :, -1].detach().float().clone()  # [heads, positions]

    return post


def _eager_pass(model, ids, cache, mask, past) -> dict[int, torch.Tensor]:
    """The newest token's pass with eager attention; our own scoped hooks on each layer's attention
    module keep its weights (transformers' output_attentions would install hooks that stay)."""
    from explorer.model.passes import position_ids

    try:
        lay = layout(model)
    except LayoutError as e:
        raise InsideUnavailable(f"attention unavailable: {e}") from None
    before = getattr(model.config, "_attn_implementation", None)
    switch = before not in (None, "eager") and hasattr(model, "set_attn_implementation")
    store: dict[int, torch.Tensor] = {}
    hooks = {layer.attention: (None, _weights_catcher(store, layer.index)) for layer in lay.layers}
    with model_lock(model):  # the switch and the hooks are seen by this pass only
        try:
            if switch:
                model.set_attn_implementation("eager")
            with hooked(hooks), torch.inference_mode():
                model(
                    input_ids=ids, attention_mask=mask, cache=cache, use_cache=True,
                    position_ids=position_ids(ids, past, mask),
                )  # fmt: skip
        except (ValueError, TypeError, NotImplementedError) as e:
            raise InsideUnavailable(
                f"attention unavailable: {type(model).__name__} could not run with eager "
                f"attention ({e})"
            ) from None
        finally:
            if switch:
                model.set_attn_implementation(before)
    if len(store) != len(lay.layers):
        raise InsideUnavailable(
            f"attention unavailable: {type(model).__name__}'s attention modules returned weights in "
            f"{len(store)} of {len(lay.layers)} layers (they must return (output, weights [B, heads, "
            "T, positions]) under eager attention)"
        )
    return store


def attention(model, replay, *, text=str) -> dict:
    """{"layers", "heads", "positions", "tokens", "weights" [L][H][positions], "mean" [L][positions],
    "max" [L][positions], "sink" [L]} for the newest token of a Replay (row 0)."""
    cache, last, mask, past = replay.last_token(model)
    store = _eager_pass(model, last, cache, mask, past)
    w = torch.stack([store[i] for i in range(len(store))])  # [L, H, positions]
    ids = replay.ids[0].tolist()
    first = 0 if replay.mask is None else int(replay.mask[0].nonzero()[0])  # first real token
    return {
        "layers": w.shape[0],
        "heads": w.shape[1],
        "positions": list(range(w.shape[2])),
        "tokens": [text(t) for t in ids[: w.shape[2]]],
        "padding": first,
        "weights": w.tolist(),
        "mean": w.mean(1).tolist(),
        "max": w.amax(1).tolist(),
        "sink": w[:, :, first].mean(1).tolist(),
    }
