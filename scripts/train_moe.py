"""The bundled mixture-of-experts model: its shape, how it is built, and its model-card lines.

scripts/train_bundled.py trains it (``--only moe`` trains it alone, reusing the bundled target's
tokenizer) on the same corpus as the dense target and draft. The class is transformers' own
Qwen3-MoE (``Qwen3MoeForCausalLM``): a softmax router picks the top-k of E experts per token per
layer, and the k weights are renormalised to sum to 1 (``norm_topk_prob``). During training the
router's load-balancing loss (Switch Transformer style, ``router_aux_loss_coef``) is added to the
language-model loss so that every expert gets work; evaluation reports the language-model loss only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

MOE_PROMPTS: tuple[str, ...] = ("The return statement", "A list comprehension", "Return a new")


@dataclass(frozen=True)
class MoeSpec:
    """Architecture of the bundled Qwen3-MoE model (other settings are Qwen3-MoE defaults)."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    num_experts: int
    experts_per_token: int
    moe_intermediate_size: int  # the width of one expert's SwiGLU MLP
    router_aux_loss_coef: float = (
        0.1  # 0.01 left experts idle after 600 steps (one had 0 of 1,920 tokens)
    )
    max_position_embeddings: int = 512


MOE_SPEC = MoeSpec(
    "moe",
    hidden_size=256,
    num_layers=4,
    num_heads=8,
    num_kv_heads=4,
    num_experts=16,
    experts_per_token=2,
    moe_intermediate_size=96,
)


def moe_config(spec: MoeSpec, vocab_size: int, special_ids: dict[str, int]) -> Qwen3MoeConfig:
    """The Qwen3-MoE config following ``spec``; it trains with the router's load-balancing loss on
    (``output_router_logits``), switched off again before saving (finish_moe)."""
    return Qwen3MoeConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=4 * spec.hidden_size,  # unused: every layer is sparse
        moe_intermediate_size=spec.moe_intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.hidden_size // spec.num_heads,
        num_experts=spec.num_experts,
        num_experts_per_tok=spec.experts_per_token,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        output_router_logits=True,
        router_aux_loss_coef=spec.router_aux_loss_coef,
        max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        dtype="float32",
        **special_ids,
    )


def is_moe(model: torch.nn.Module) -> bool:
    return bool(getattr(model.config, "num_experts", 0))


def finish_moe(model: Qwen3MoeForCausalLM) -> None:
    """After training: plain forwards (no router logits or auxiliary loss) for the saved model."""
    model.config.output_router_logits = False


def active_parameters(model: Qwen3MoeForCausalLM) -> int:
    """Parameters one token uses: all but the (E - k) experts it is not routed to, per layer."""
    c = model.config
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    return sum(p.numel() for p in model.parameters()) - round(
        experts * (1 - c.num_experts_per_tok / c.num_experts)
    )


def moe_config_summary(model: Qwen3MoeForCausalLM) -> dict[str, Any]:
    """The architecture numbers worth showing in training.json."""
    c = model.config
    return {
        "architecture": "Qwen3MoeForCausalLM",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "moe_intermediate_size": c.moe_intermediate_size,
        "num_experts": c.num_experts,
        "num_experts_per_tok": c.num_experts_per_tok,
        "norm_topk_prob": c.norm_topk_prob,
        "router_aux_loss_coef": c.router_aux_loss_coef,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "max_position_embeddings": c.max_position_embeddings,
        "tie_word_embeddings": c.tie_word_embeddings,
        "rms_norm_eps": c.rms_norm_eps,
        "hidden_act": c.hidden_act,
        "active_parameters": active_parameters(model),
    }


def card_moe(training: dict[str, Any]) -> list[str]:
    """The model card's section on the MoE model, beside the dense target it is compared with."""
    models = training["models"]
    if "moe" not in models:
        return []
    m, t = models["moe"], models["target"]
    c = m["config"]
    return [
        "## The mixture-of-experts model (`bundled:moe`)",
        "",
        f"transformers' `{c['architecture']}` on the same corpus and tokenizer, trained by "
        f"`{m.get('command', 'python scripts/train_bundled.py --only moe')}`: "
        f"{c['num_hidden_layers']} layers x {c['hidden_size']} hidden "
        f"({c['num_attention_heads']} / {c['num_key_value_heads']} KV heads), every MLP a routed "
        f"layer of {c['num_experts']} SwiGLU experts of width {c['moe_intermediate_size']}, "
        f"top-{c['num_experts_per_tok']} per token (softmax router, the k weights renormalised to "
        f"sum to 1), no shared expert; load-balancing loss x {c['router_aux_loss_coef']} in training.",
        "",
        "| | moe | target (dense) |",
        "|---|---|---|",
        f"| parameters, total | {m['parameters']:,} | {t['parameters']:,} |",
        f"| parameters, active per token | {c['active_parameters']:,} | {t['parameters']:,} |",
        f"| steps x tokens per step | {m['steps']:,} x {m['tokens_per_step']:,} | "
        f"{t['steps']:,} x {t['tokens_per_step']:,} |",
        f"| wall time | {m['wall_time_s'] / 60:.1f} min ({m['seconds_per_step']} s/step) | "
        f"{t['wall_time_s'] / 60:.1f} min ({t['seconds_per_step']} s/step) |",
        f"| validation loss (perplexity), same held-out text | **{m['final_val_loss']:.3f}** "
        f"({m['final_val_perplexity']:.1f}) | {t['final_val_loss']:.3f} "
        f"({t['final_val_perplexity']:.1f}) |",
        "",
        *(
            [
                f"Machine: {m['machine']['cpu_count']} CPU cores, {m['machine']['torch_threads']} "
                f"torch thread(s), shared with other work; torch {m['machine']['torch']}, "
                f"transformers {m['machine']['transformers']}.",
                "",
            ]
            if "machine" in m
            else []
        ),
        "The MoE model trained for fewer steps than the target (a short run on a shared CPU), so "
        "its perplexity is no verdict on MoE against dense; it exists so that routing is real: "
        "which experts each token reads, and how many a batch touches.",
        "",
    ]
