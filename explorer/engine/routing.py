"""Routing as plain data: which experts each token of a step was sent to, and what the batch touched.

During a Session step, `capture(model)` hooks every router of a mixture-of-experts model (a
context manager: the hooks are removed in `finally`) and keeps a reference to each router's
choice; after the pass `record(choices=False)` keeps the experts each layer touched and their load
on the Step (`step.routing`: the step's cost counts the expert weights it read). Each token's own
choice is fetched on demand, as attention is: Session.routing(step) replays the step with the
routers hooked and `record()` gives the whole dict:

    {"tokens": T,                           # tokens routed per layer (batch rows x tokens fed)
     "tokens_kept": t,                      # tokens whose choices are listed (<= MAX_TOKENS_KEPT)
     "experts_touched": [n per MoE layer],  # distinct experts the pass read, per layer
     "layers": [{"layer": i,                # decoder layer index
                 "touched": [expert ids], "load": [tokens per touched expert],
                 "experts": [[k ids] per kept token], "weights": [[k weights] per kept token]}]}
                                            # (tokens_kept, experts, weights: on demand only)

Token t is row t // tokens_fed, position t % tokens_fed of the fed tokens (left padding included:
a pad token is routed, and its experts are read, like any other). The weights are the router's own
output: Qwen3-MoE with norm_topk_prob, Mixtral and gpt-oss renormalise the k weights to sum to 1;
Qwen3-MoE without it keeps the k softmax probabilities (they sum to less than 1).

`routing_of(trace)` gathers those records over a trace (a saved one too: no model needed): per
step, and the load per expert over the whole trace. A dense model has no router: it says so.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from explorer.model.moe import experts_touched_expected, routers

MAX_TOKENS_KEPT = 256  # per layer per step: choices listed for at most this many tokens
_ROUTERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> [(layer, router)]


def moe_routers(model: nn.Module) -> list[tuple[int, nn.Module]]:
    """(decoder layer index, router) of every MoE layer, in order; [] for a dense model."""
    found = _ROUTERS.get(model)
    if found is None:
        from explorer.model.layout import LayoutError, layout

        mods = routers(model)
        try:
            index = {
                id(m): layer.index for layer in layout(model).layers for m in layer.mlp.modules()
            }
        except LayoutError:
            index = {}
        found = _ROUTERS[model] = [(index.get(id(r), i), r) for i, r in enumerate(mods)]
    return found


class Capture:
    """The routers' choices during one forward pass (references only: no copy, no device sync)."""

    def __init__(self, layers: list[int]):
        self.layers = layers
        self.chosen: dict[int, tuple[Any, Any]] = {}  # layer -> (indices [T, k], weights [T, k])

    def hook(self, layer: int):
        def keep(module, inputs, output):
            if isinstance(output, tuple) and len(output) == 3:  # (logits, weights, indices)
                self.chosen[layer] = (output[2].detach(), output[1].detach())

        return keep

    def record(self, max_tokens: int = MAX_TOKENS_KEPT, choices: bool = True) -> dict | None:
        """This pass's routing as plain data (the module docstring); None if a router was missed.
        choices=False: the experts touched and their load only (what a Session step keeps), not
        each token's experts and weights (Session.routing(step) fetches those on demand)."""
        if set(self.chosen) != set(self.layers):
            return None
        chosen = [self.chosen[i] for i in self.layers]
        tokens = int(chosen[0][0].shape[0])
        # every layer routes the same tokens: one transfer to the host for all the layers together
        ids = torch.stack([c[0].reshape(tokens, -1) for c in chosen]).cpu()  # [layers, T, k]
        if not choices:
            layers = [_touched(i, ids[n]) for n, i in enumerate(self.layers)]
            return {
                "tokens": tokens,
                "experts_touched": [len(r["touched"]) for r in layers],
                "layers": layers,
            }
        weights = torch.stack([c[1].reshape(tokens, -1)[:max_tokens] for c in chosen])
        weights = weights.float().cpu()  # [layers, min(T, kept), k]
        layers = [
            _layer_record(i, ids[n], weights[n], max_tokens) for n, i in enumerate(self.layers)
        ]
        return {
            "tokens": tokens,
            "tokens_kept": min(tokens, max_tokens),
            "experts_touched": [len(r["touched"]) for r in layers],
            "layers": layers,
        }


def _touched(layer: int, ids) -> dict[str, Any]:
    """One layer's experts touched and the tokens each got, from host ids [T, k]."""
    touched, load = ids.unique(return_counts=True)
    return {"layer": layer, "touched": touched.tolist(), "load": load.tolist()}


def _layer_record(layer: int, ids, kept, max_tokens: int) -> dict[str, Any]:
    """One layer's record from host tensors: ids [T, k], kept (the listed tokens' weights) [t, k]."""
    return {
        **_touched(layer, ids),
        "experts": ids[:max_tokens].tolist(),
        "weights": [[round(w, 6) for w in row] for row in kept.tolist()],
    }


@contextmanager
def capture(model: nn.Module, enabled: bool = True):
    """Hooks on every router for one pass, removed in `finally`; yields a Capture (None for a
    dense model or when not enabled, e.g. a torch.compile'd pass that hooks would break)."""
    found = moe_routers(model) if enabled else []
    if not found:
        yield None
        return
    cap = Capture([layer for layer, _ in found])
    handles = [router.register_forward_hook(cap.hook(layer)) for layer, router in found]
    try:
        yield cap
    finally:
        for h in handles:
            h.remove()


def dense_message(model: dict[str, Any]) -> str:
    return (
        f"{model.get('name', 'this model')} is a dense model: it has no router, every token "
        "reads the whole MLP of every layer"
    )


def routing_of(trace, step: int | None = None) -> dict[str, Any]:
    """The routing of a trace's steps (all, or step `step`), and the load per expert summed over
    them: {"dense", "message", "num_experts", "experts_per_token", "layers", "steps", "load"}.
    A step recorded without routing (a compiled pass, a saved trace from before) has none."""
    model = trace.model
    e, k = model.get("num_experts"), model.get("experts_per_token")
    out: dict[str, Any] = {"model": model.get("name"), "dense": not e, "num_experts": e}
    out["experts_per_token"] = k
    if not e:
        return out | {"message": dense_message(model), "layers": [], "steps": [], "load": []}
    everything = list(trace.steps)  # one snapshot, whatever another thread appends meanwhile
    steps = everything if step is None else [_one_step(everything, step)]
    rows = [_step_row(s, e, k) for s in steps]
    first = next((s.routing for s in steps if getattr(s, "routing", None)), None)
    layers = [r["layer"] for r in first["layers"]] if first else []
    load = [[0] * e for _ in layers]
    for s in steps:
        for li, rec in enumerate((getattr(s, "routing", None) or {}).get("layers", [])):
            for expert, n in zip(rec["touched"], rec["load"]):
                load[li][expert] += n
    message = (
        None
        if first
        else "no step here recorded its routing (compiled or speculative passes do not)"
    )
    return out | {"message": message, "layers": layers, "steps": rows, "load": load}


def with_choices(out: dict[str, Any], replayed: dict[str, Any] | None) -> dict[str, Any]:
    """routing_of(trace, step) with the step's per-token choices from a replay of it (a
    Capture.record() of the same pass): its row's layers then list each token's experts and
    weights. None (a router missed): unchanged."""
    if replayed is None or out["dense"]:
        return out
    row = out["steps"][0] | replayed
    layers = out["layers"] or [r["layer"] for r in replayed["layers"]]
    return out | {"steps": [row], "layers": layers, "message": None}


def _one_step(steps: list, step: int):
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < len(steps):
        raise ValueError(
            f"step must be one of the recorded steps 0..{len(steps) - 1}, got {step!r}"
        )
    return steps[step]


def _step_row(s, e: int, k: int) -> dict[str, Any]:
    """One step's routing with the uniform-routing expectation beside what was measured."""
    rec = getattr(s, "routing", None)
    tokens = s.batch_size * s.tokens_fed
    row = {"index": s.index, "phase": s.phase, "batch": s.batch_size, "tokens": tokens}
    row["experts_touched_formula"] = experts_touched_expected(e, k, tokens)
    return row | (rec or {"experts_touched": None, "layers": []})
