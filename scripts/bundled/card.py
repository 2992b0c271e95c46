"""The model card (assets/models/README.md), written from training.json and samples.json."""

from __future__ import annotations

import math
from typing import Any

from scripts.bundled.settings import ALL_MODELS
from scripts.train_moe import card_moe


def model_card(training: dict[str, Any], samples: dict[str, Any]) -> str:
    """assets/models/README.md, written from training.json and samples.json (never by hand)."""
    lines = [
        *_card_intro(training),
        *_card_models(training),
        *card_moe(training),
        *_card_samples(samples),
        *_card_limits(),
    ]
    return "\n".join(lines)


def _card_intro(training: dict[str, Any]) -> list[str]:
    """Title, how the files are written, the corpus and its licence, the tokenizer."""
    corpus, tok = training["corpus"], training["tokenizer"]
    return [
        "# Bundled models (model card)",
        "",
        "Llama-architecture causal LMs (target, draft) and a Qwen3-MoE model (moe) that share one",
        "byte-level BPE tokenizer, trained on a CPU by",
        f"`{training.get('command', 'python scripts/train_bundled.py')}`. This file, `training.json` (every",
        "number, the loss history) and `samples.json` (greedy continuations, which the tests regenerate",
        "token for token) are written by that script.",
        "",
        "## Corpus and licence",
        "",
        f"{corpus['description']} {corpus['characters']:,} characters; "
        f"{corpus['train_documents']:,} training and {corpus['val_documents']:,} validation documents "
        f"(split by `{corpus['validation_split']}`): {corpus['train_tokens']:,} training and "
        f"{corpus['val_tokens']:,} validation tokens.",
        "",
        "Licence of the text: Python's documentation and docstrings are distributed under the PSF",
        "License Agreement (Python Software Foundation); they ship with every CPython installation, so the",
        "corpus is rebuilt offline on any machine. The weights are released with this repository (MIT).",
        "",
        "## Tokenizer",
        "",
        f"{tok['type']}, vocabulary {tok['vocab_size']:,}; `<|endoftext|>` is BOS and EOS (prepended to "
        "every encoded text, as every training document starts with it), `<|pad|>` pads batches.",
        "",
    ]


def _card_models(training: dict[str, Any]) -> list[str]:
    """The target-vs-draft table, the note when the draft ends lower, the machine."""
    tok, m = training["tokenizer"], training["machine"]
    t, d = training["models"]["target"], training["models"]["draft"]
    return [
        *_card_table(t, d),
        "",
        *(
            [
                "The draft ends with the lower losses, train and validation: neither model is near "
                "convergence after ~3M tokens, and the target's optimiser settings were not tuned "
                "beyond a first guess (a larger model is normally the better one at equal data). For "
                "the lessons what matters is how often the two agree (speculative acceptance), which "
                "the explorer measures rather than assumes.",
                "",
            ]
            if d["final_val_loss"] < t["final_val_loss"]
            else []
        ),
        f"Draft / target parameters: {training['draft_to_target_parameter_ratio']}. Uniform guessing "
        f"would give loss ln({tok['vocab_size']}) = {math.log(tok['vocab_size']):.2f}.",
        f"Machine: {m['platform']}, {m['cpu_count']} CPU cores, {m['torch_threads']} torch threads; "
        f"Python {m['python']}, torch {m['torch']}, transformers {m['transformers']}. Total time "
        f"{training['total_wall_time_s'] / 60:.1f} min. Same seeds and versions reproduce the weights;",
        "another thread count or CPU may differ in the last bits (and so in a late greedy token).",
        "",
    ]


def _card_table(t: dict[str, Any], d: dict[str, Any]) -> list[str]:
    """The target-vs-draft table: shape, training, losses."""

    def row(label: str, fn) -> str:
        return f"| {label} | {fn(t)} | {fn(d)} |"

    return [
        "## Models and training",
        "",
        "| | target | draft |",
        "|---|---|---|",
        row("parameters", lambda r: f"{r['parameters']:,}"),
        row(
            "layers x hidden (heads / KV heads)",
            lambda r: (
                f"{r['config']['num_hidden_layers']} x "
                f"{r['config']['hidden_size']} ({r['config']['num_attention_heads']} / "
                f"{r['config']['num_key_value_heads']})"
            ),
        ),
        row("MLP (SwiGLU) width", lambda r: r["config"]["intermediate_size"]),
        row("positions", lambda r: r["config"]["max_position_embeddings"]),
        row("steps x tokens per step", lambda r: f"{r['steps']:,} x {r['tokens_per_step']:,}"),
        row("tokens seen (epochs)", lambda r: f"{r['tokens_seen']:,} ({r['epochs']})"),
        row(
            "optimiser", lambda r: f"AdamW lr {r['optimizer']['lr']}, {r['optimizer']['schedule']}"
        ),
        row("checkpoint kept (best validation)", lambda r: f"step {r['saved_checkpoint_step']:,}"),
        row(
            "wall time",
            lambda r: f"{r['wall_time_s'] / 60:.1f} min ({r['seconds_per_step']} s/step)",
        ),
        row(
            "final train loss (perplexity)",
            lambda r: f"{r['final_train_loss']:.3f} ({r['final_train_perplexity']:.1f})",
        ),
        row(
            "final validation loss (perplexity)",
            lambda r: f"**{r['final_val_loss']:.3f}** ({r['final_val_perplexity']:.1f})",
        ),
    ]


def _card_samples(samples: dict[str, Any]) -> list[str]:
    """The greedy continuations the tests regenerate token for token."""
    lines = [
        "## Greedy continuations",
        "",
        f"`{samples['how']}`",
        "",
    ]
    for name in ALL_MODELS:
        for sample in samples.get(name, []):
            text = sample["text"].replace("\n", "\\n")
            lines.append(f"- {name}: **{sample['prompt']}**{text}")
    return lines


def _card_limits() -> list[str]:
    """What the models are for and what not."""
    return [
        "",
        "## Intended use and limits",
        "",
        "Teaching models: small enough to step through in milliseconds on a CPU, trained enough that their",
        "distributions mean something. They know only Python's documentation, make things up, and must",
        "not be used to answer questions. For cost lessons at real scale use the `arch:` shapes (real",
        "configurations, random weights) or a hub model on a GPU.",
        "",
    ]
