#!/usr/bin/env python
"""Train the two small offline models bundled with Inference Explorer.

The corpus is built from text that ships with every CPython installation:
``pydoc_data.topics.topics`` (the language reference topics that ``help()``
shows) plus the docstrings of a fixed list of standard-library modules.  A
byte-level BPE tokenizer is trained on it, then two Llama-architecture causal
language models that share that tokenizer:

* ``target`` -- the "big" model (~6 M parameters, grouped-query attention),
  used to show next-token distributions, sampling, KV caches, ...
* ``draft`` -- a much smaller model (< 1/3 of the target's parameters) trained
  on the same data, used as the proposal model for speculative decoding.
* ``moe`` -- a Qwen3-MoE mixture-of-experts model (16 experts, top-2) on the same
  data and tokenizer, so that routing is real (scripts/train_moe.py).

Everything is deterministic (fixed seeds, deterministic torch algorithms, a
sorted module list, a hash-based validation split), so a rerun on the same
Python / torch versions reproduces the same weights.

Usage::

    python scripts/train_bundled.py                 # full run -> assets/models/
    python scripts/train_bundled.py --quick --out /tmp/bundled   # smoke test
    python scripts/train_bundled.py --only moe      # retrain one model; the others and the
                                                    # tokenizer (read from target/) stay

This script depends on torch, tokenizers and transformers, and takes the corpus
cutting and the validation split from ``explorer/model/corpus.py`` (standard
library only), which the ladder sweep uses to score perplexity on the same
held-out text.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import tokenizers
import torch
import transformers
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

sys.path.insert(
    0, str(Path(__file__).resolve().parent.parent)
)  # explorer/ and scripts/, uninstalled
from scripts.bundled.card import model_card  # noqa: E402
from scripts.bundled.corpus import Corpus, build_corpus  # noqa: E402
from scripts.bundled.model import build_model, config_summary, count_parameters  # noqa: E402
from scripts.bundled.settings import (  # noqa: E402
    ALL_MODELS,
    DEFAULT_OUT,
    DRAFT_PROMPTS,
    DRAFT_SPEC,
    TARGET_PROMPTS,
    TARGET_SPEC,
    ModelSpec,
    RunSettings,
    TrainSettings,
)
from scripts.bundled.tokenizer import (  # noqa: E402
    BOS_EOS_TOKEN,
    PAD_TOKEN,
    chunk_sequences,
    encode_stream,
    train_tokenizer,
)
from scripts.bundled.training import train_model  # noqa: E402
from scripts.train_moe import MOE_PROMPTS, MoeSpec, finish_moe, moe_config_summary  # noqa: E402

__all__ = ["main", "model_card", "parse_args", "run"]


@torch.no_grad()
def greedy_samples(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    prompts: Iterable[str],
    max_new_tokens: int,
) -> list[dict[str, Any]]:
    """Greedy continuations, exactly as the tests will regenerate them."""
    model.eval()
    samples = []
    for prompt in prompts:
        inputs = tokenizer(prompt, return_tensors="pt")
        out = model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens)
        new_ids = out[0, inputs["input_ids"].shape[1] :].tolist()
        samples.append(
            {
                "prompt": prompt,
                "prompt_ids": inputs["input_ids"][0].tolist(),
                "max_new_tokens": max_new_tokens,
                "new_token_ids": new_ids,
                "text": tokenizer.decode(new_ids, skip_special_tokens=False),
            }
        )
        print(f"  {prompt!r} -> {samples[-1]['text']!r}", flush=True)
    return samples


def save_model(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, path: Path) -> None:
    """Save model (safetensors) and tokenizer side by side."""
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)


def write_json(path: Path, data: Any) -> None:
    """Pretty-printed UTF-8 JSON with a trailing newline."""
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def machine_info() -> dict[str, Any]:
    """Where the training ran."""
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
    }


def configure_determinism(seed: int, threads: int) -> None:
    """Seeds, thread count and deterministic kernels."""
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    transformers.utils.logging.disable_progress_bar()


def train_one(
    spec: ModelSpec,
    s: TrainSettings,
    tokenizer: PreTrainedTokenizerFast,
    train_rows: torch.Tensor,
    val_rows: torch.Tensor,
    run: RunSettings,
    prompts: Iterable[str],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Build, train, save and sample one model; returns (report, samples)."""
    moe = isinstance(spec, MoeSpec)
    model = build_model(spec, tokenizer, seed=s.seed)
    params = count_parameters(model)
    print(
        f"[{spec.name}] {params:,} parameters, {s.steps} steps x {s.tokens_per_step} tokens",
        flush=True,
    )
    report = {
        "parameters": params,
        "config": (moe_config_summary if moe else config_summary)(model),
        "spec": dataclasses.asdict(spec),
    }
    report.update(train_model(model, train_rows, val_rows, s))
    if moe:
        finish_moe(model)
        report["command"], report["machine"] = run.command, machine_info()
    save_model(model, tokenizer, run.out_dir / spec.name)
    samples = greedy_samples(model, tokenizer, prompts, run.max_new_tokens)
    return report, samples


def run(settings: RunSettings) -> None:
    """Build corpus and tokenizer, train the models asked for, write all outputs."""
    t0 = time.perf_counter()
    print("building corpus ...", flush=True)
    corpus = build_corpus(settings.val_fraction)
    print(
        f"  {len(corpus.train_docs)} train / {len(corpus.val_docs)} val documents, "
        f"{corpus.num_chars:,} characters",
        flush=True,
    )
    tokenizer = prepare_tokenizer(settings, corpus)
    train_stream = encode_stream(tokenizer, corpus.train_docs)
    val_stream = encode_stream(tokenizer, corpus.val_docs)
    print(
        f"  vocab {len(tokenizer)}, {train_stream.numel():,} train / "
        f"{val_stream.numel():,} val tokens",
        flush=True,
    )
    partial = set(settings.only) != set(ALL_MODELS)
    training, samples = previous_records(settings.out_dir) if partial else ({"models": {}}, {})
    plan = {
        "target": (settings.target, settings.target_train, TARGET_PROMPTS),
        "draft": (settings.draft, settings.draft_train, DRAFT_PROMPTS),
        "moe": (settings.moe, settings.moe_train, MOE_PROMPTS),
    }
    for name in settings.only:
        spec, s, prompts = plan[name]
        train_rows = chunk_sequences(train_stream, s.seq_len)
        val_rows = chunk_sequences(val_stream, s.seq_len)
        training["models"][name], samples[name] = train_one(
            spec, s, tokenizer, train_rows, val_rows, settings, prompts
        )
    if not partial or "target" in settings.only:
        training = training_record(settings, corpus, tokenizer, train_stream, val_stream) | {
            "models": training["models"]
        }
        training["total_wall_time_s"] = round(time.perf_counter() - t0, 1)
    write_records(settings, training, samples)
    print(f"done in {time.perf_counter() - t0:.0f}s -> {settings.out_dir}", flush=True)


def prepare_tokenizer(settings: RunSettings, corpus: Corpus) -> PreTrainedTokenizerFast:
    """Train the tokenizer, or, when the target is not retrained, reuse the one it was trained with."""
    if "target" in settings.only:
        print("training tokenizer ...", flush=True)
        return train_tokenizer(corpus.train_docs, settings.vocab_size)
    path = settings.out_dir / "target"
    if not (path / "tokenizer.json").exists():
        raise SystemExit(f"--only {','.join(settings.only)} needs the target's tokenizer in {path}")
    print(f"reusing the tokenizer of {path} ...", flush=True)
    return PreTrainedTokenizerFast.from_pretrained(path)


def previous_records(out_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """training.json and samples.json as an earlier run wrote them (a partial run updates them)."""
    try:
        training = json.loads((out_dir / "training.json").read_text(encoding="utf-8"))
        samples = json.loads((out_dir / "samples.json").read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise SystemExit(
            f"a partial run (--only) updates earlier records: {err.filename} missing"
        ) from None
    samples.pop("how", None)
    return training, samples


def training_record(
    settings: RunSettings,
    corpus: Corpus,
    tokenizer: PreTrainedTokenizerFast,
    train_stream: torch.Tensor,
    val_stream: torch.Tensor,
) -> dict[str, Any]:
    """training.json's header: the command, the machine, the corpus and the tokenizer."""
    return {
        "generated_by": "scripts/train_bundled.py",
        "command": settings.command,
        "machine": machine_info(),
        "corpus": {
            "description": "pydoc_data.topics.topics (Python reference-manual topics) plus "
            "inspect.getdoc docstrings of a fixed, sorted list of "
            "standard-library modules and their public functions, classes "
            "and methods; whitespace lightly cleaned; long texts split at "
            "blank lines into documents of <= ~2000 characters; exact "
            "duplicates removed; documents joined with <|endoftext|>.",
            "licence": "Python documentation and docstrings: PSF License Agreement "
            "(Python Software Foundation); see assets/models/README.md",
            "validation_split": f"sha256(document) < {settings.val_fraction} (by document)",
            "characters": corpus.num_chars,
            "train_documents": len(corpus.train_docs),
            "val_documents": len(corpus.val_docs),
            "train_tokens": int(train_stream.numel()),
            "val_tokens": int(val_stream.numel()),
            "tokens": int(train_stream.numel() + val_stream.numel()),
            "sources": corpus.sources,
        },
        "tokenizer": {
            "type": "byte-level BPE (tokenizers: ByteLevel pre-tokenizer and decoder)",
            "vocab_size": len(tokenizer),
            "vocab_size_requested": settings.vocab_size,
            "special_tokens": {"bos": BOS_EOS_TOKEN, "eos": BOS_EOS_TOKEN, "pad": PAD_TOKEN},
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
            "adds_bos": True,
        },
    }


def write_records(settings: RunSettings, training: dict[str, Any], samples: dict[str, Any]) -> None:
    """training.json, samples.json and the model card written from them."""
    models = training["models"]
    if "target" in models and "draft" in models:
        ratio = models["draft"]["parameters"] / models["target"]["parameters"]
        training["draft_to_target_parameter_ratio"] = round(ratio, 4)
    samples_record = {
        "how": "model.generate(**tok(prompt, return_tensors='pt'), do_sample=False, "
        f"max_new_tokens={settings.max_new_tokens})",
        **samples,
    }
    write_json(settings.out_dir / "training.json", training)
    write_json(settings.out_dir / "samples.json", samples_record)
    (settings.out_dir / "README.md").write_text(
        model_card(training, samples_record), encoding="utf-8"
    )


def _parser() -> argparse.ArgumentParser:
    """The command line (unchanged since the script was one file)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder")
    p.add_argument(
        "--quick", action="store_true", help="smoke run: few steps, small batches (use with --out)"
    )
    p.add_argument("--target-steps", type=int, default=None)
    p.add_argument("--draft-steps", type=int, default=None)
    p.add_argument("--moe-steps", type=int, default=None)
    p.add_argument(
        "--moe-batch-size", type=int, default=None, help="rows per MoE step (default --batch-size)"
    )
    p.add_argument(
        "--only",
        default=",".join(ALL_MODELS),
        help="comma-separated models to train (target,draft,moe); the others' weights and "
        "records stay as they are, and without target the tokenizer is read from target/",
    )
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument(
        "--threads",
        type=int,
        default=2,
        help="torch CPU threads (the bundled models used 2; another count can "
        "change the last bits of the weights)",
    )
    p.add_argument("--seed", type=int, default=1234)
    return p


def parse_args(argv: list[str] | None = None) -> RunSettings:
    """Command-line flags -> RunSettings."""
    p = _parser()
    a = p.parse_args(argv)
    quick = a.quick
    target_steps = a.target_steps or (20 if quick else 1500)
    draft_steps = a.draft_steps or (20 if quick else 1500)
    moe_steps = a.moe_steps or (20 if quick else 600)
    only = tuple(n.strip() for n in a.only.split(",") if n.strip())
    if not only or set(only) - set(ALL_MODELS):
        p.error(f"--only takes names from {','.join(ALL_MODELS)}, got {a.only!r}")
    batch = 4 if quick else a.batch_size
    eval_every = 10 if quick else 100
    configure_determinism(a.seed, a.threads)
    common = dict(batch_size=batch, seq_len=a.seq_len, eval_every=eval_every, seed=a.seed)
    return RunSettings(
        out_dir=a.out,
        vocab_size=a.vocab_size,
        val_fraction=0.05,
        seed=a.seed,
        target=TARGET_SPEC,
        draft=DRAFT_SPEC,
        target_train=TrainSettings(
            steps=target_steps, lr=3e-3, warmup_steps=min(100, target_steps // 4), **common
        ),
        draft_train=TrainSettings(
            steps=draft_steps, lr=4e-3, warmup_steps=min(100, draft_steps // 4), **common
        ),
        moe_train=TrainSettings(
            steps=moe_steps,
            lr=3e-3,
            warmup_steps=min(60, moe_steps // 4),
            **(common | {"batch_size": a.moe_batch_size or batch}),
        ),
        only=only,
        command=" ".join(
            ["python scripts/train_bundled.py", *(argv if argv is not None else sys.argv[1:])]
        ),
    )


def main(argv: list[str] | None = None) -> None:
    """Entry point."""
    run(parse_args(argv))


if __name__ == "__main__":
    main()
