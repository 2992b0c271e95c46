"""Where the parts of a causal LM live: embeddings, decoder layers (attention, MLP, norms), final
norm, LM head. Read from the module tree, not from a per-family table, so any transformers model
laid out as `embeddings -> ModuleList of blocks -> final norm -> lm_head` works (Llama, Qwen2,
Mistral, GPT-2, SmolLM, ...). A model laid out otherwise gets a LayoutError naming what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

ATTENTION_NAMES = ("self_attn", "attn", "attention", "self_attention")
MLP_NAMES = ("mlp", "feed_forward", "ffn")


class LayoutError(ValueError):
    """The model's module tree is not laid out as this explorer expects; the message names what is missing."""


@dataclass
class Layer:
    index: int
    block: nn.Module
    attention: nn.Module
    mlp: nn.Module
    norms: list[nn.Module] = field(default_factory=list)
    projections: list[nn.Module] = field(default_factory=list)  # q/k/v/o (or c_attn/c_proj)


@dataclass
class Layout:
    embeddings: list[nn.Module]  # token embedding first, then learned positions if any
    layers: list[Layer]
    final_norm: nn.Module
    lm_head: nn.Module


def is_norm(module: nn.Module) -> bool:
    return "norm" in type(module).__name__.lower()


def _child(block: nn.Module, names: tuple[str, ...]) -> nn.Module | None:
    return next(
        (getattr(block, n) for n in names if isinstance(getattr(block, n, None), nn.Module)), None
    )


def _blocks(model: nn.Module, n_layers: int | None) -> nn.ModuleList:
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    if n_layers is not None:
        lists = [m for m in lists if len(m) == n_layers] or lists
    if not lists:
        raise LayoutError(f"{type(model).__name__} has no ModuleList of decoder layers")
    return max(lists, key=len)


def _layer(i: int, block: nn.Module) -> Layer:
    attention, mlp = _child(block, ATTENTION_NAMES), _child(block, MLP_NAMES)
    missing = [n for n, m in (("attention", attention), ("MLP", mlp)) if m is None]
    if missing:
        raise LayoutError(
            f"decoder layer {i} ({type(block).__name__}) has no {' or '.join(missing)} module "
            f"(looked for {ATTENTION_NAMES if attention is None else MLP_NAMES})"
        )
    norms = [m for m in block.children() if is_norm(m)]
    projections = [
        m for m in attention.children() if isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D"
    ]
    return Layer(i, block, attention, mlp, norms, projections)


def layout(model: nn.Module) -> Layout:
    """The Layout of a transformers causal LM; LayoutError naming what is missing otherwise."""
    config = getattr(model, "config", None)
    n_layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
    blocks = _blocks(model, n_layers)
    inside = {id(m) for m in blocks.modules()}
    lm_head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if lm_head is None:
        raise LayoutError(f"{type(model).__name__} has no output embeddings (lm_head)")
    embed = model.get_input_embeddings()
    others = [
        m
        for m in model.modules()
        if isinstance(m, nn.Embedding) and m is not embed and id(m) not in inside
    ]
    norms = [m for m in model.modules() if is_norm(m) and id(m) not in inside]
    if not norms:
        raise LayoutError(f"{type(model).__name__} has no final norm outside its decoder layers")
    return Layout(
        embeddings=[embed, *others],
        layers=[_layer(i, b) for i, b in enumerate(blocks)],
        final_norm=norms[-1],
        lm_head=lm_head,
    )
