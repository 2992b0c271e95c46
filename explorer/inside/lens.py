"""The logit lens: read the residual stream after each decoder layer through the model's own final
norm and LM head, as if the model stopped there (nostalgebraist 2020).

For the newest position of row 0 only. Per layer: the top_n tokens and their probabilities, the
probability of the token finally chosen, the entropy (nats) and KL(final || layer) in nats, the
information lost by stopping at this layer. At the last layer the lens *is* the model's output
(final_norm(h_L) -> lm_head), so its distribution equals the step's logits. Only [hidden] vectors
and top_n entries are kept per layer (no full-vocabulary tensor survives the call).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from explorer.inside.hooks import InsideUnavailable, hooked
from explorer.model.layout import LayoutError, layout
from explorer.model.sharing import model_lock


def _residual_catcher(store: dict[int, torch.Tensor], i: int):
    def post(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output  # [B, T, H]
        store[i] = hidden[0, -1].detach().clone()  # [H]: row 0, newest position

    return post


def _layer_record(i, logp, final_logp, chosen, top_n, text) -> dict:
    p = logp.exp()  # [V]
    top = torch.topk(p, top_n)
    return {
        "layer": i,
        "top": [
            {"id": int(t), "text": text(int(t)), "prob": float(v)}
            for v, t in zip(top.values, top.indices)
        ],
        "prob_chosen": float(p[chosen]),
        "rank_chosen": int((p > p[chosen]).sum()),
        "entropy": float(-(p * logp).sum()),
        "kl_to_final": float((final_logp.exp() * (final_logp - logp)).sum().clamp(min=0.0)),
    }


def logit_lens(
    model, run: Callable[[], object], *, chosen: int | None = None, top_n: int = 5,
    text: Callable[[int], str] = str,
) -> list[dict]:  # fmt: skip
    """One record per decoder layer (layer, top, prob_chosen, rank_chosen, entropy, kl_to_final).

    run(): performs the step's forward pass on `model` (e.g. Replay.run); chosen: the token id
    finally chosen (default: the last layer's argmax). InsideUnavailable when the module tree is
    not laid out as embeddings -> layers -> final norm -> lm_head."""
    try:
        lay = layout(model)
    except LayoutError as e:
        raise InsideUnavailable(f"logit lens unavailable: {e}") from None
    resid: dict[int, torch.Tensor] = {}
    hooks = {layer.block: (None, _residual_catcher(resid, layer.index)) for layer in lay.layers}
    with model_lock(model), hooked(hooks):  # the hooks see this pass only
        run()
    if len(resid) != len(lay.layers):
        raise InsideUnavailable(
            f"logit lens unavailable: only {len(resid)} of {len(lay.layers)} decoder layers ran"
        )
    with torch.inference_mode():
        stacked = torch.stack([resid[i] for i in range(len(lay.layers))])  # [L, H]
        logp = torch.log_softmax(lay.lm_head(lay.final_norm(stacked)).float(), dim=-1)  # [L, V]
    final = logp[-1]
    chosen = int(final.argmax()) if chosen is None else int(chosen)
    top_n = max(1, min(int(top_n), final.numel()))
    return [_layer_record(i, logp[i], final, chosen, top_n, text) for i in range(logp.shape[0])]
