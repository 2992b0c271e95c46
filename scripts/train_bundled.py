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
import contextlib
import dataclasses
import importlib
import inspect
import io
import json
import math
import os
import platform
import sys
import time
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tokenizers
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen3MoeForCausalLM,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # explorer/model/corpus.py, from a clone without installing
from explorer.model.corpus import (  # noqa: E402
    clean_text,
    is_validation_doc,
    pydoc_topic_documents,
    split_paragraph_groups,
)
from scripts.train_moe import (  # noqa: E402
    MOE_PROMPTS,
    MOE_SPEC,
    MoeSpec,
    card_moe,
    finish_moe,
    is_moe,
    moe_config,
    moe_config_summary,
)

DEFAULT_OUT = REPO_ROOT / "assets" / "models"
ALL_MODELS = ("target", "draft", "moe")

BOS_EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"

# A fixed, sorted list of standard-library modules whose docstrings join the
# corpus.  Modules that fail to import on a given platform / Python version are
# skipped (and listed in training.json).  Modules with import-time side effects
# (antigravity, this, tkinter, turtle, idlelib, ...) and the boilerplate codec
# modules under ``encodings`` are left out on purpose.
STDLIB_MODULES: tuple[str, ...] = tuple(
    sorted(
        """
abc argparse array ast asyncio asyncio.base_events asyncio.coroutines
asyncio.events asyncio.exceptions asyncio.futures asyncio.locks
asyncio.protocols asyncio.queues asyncio.runners asyncio.streams
asyncio.subprocess asyncio.taskgroups asyncio.tasks asyncio.threads
asyncio.timeouts asyncio.transports atexit base64 bdb binascii bisect
builtins bz2 cProfile calendar cmath cmd code codecs codeop collections
collections.abc colorsys compileall concurrent.futures configparser
contextlib contextvars copy copyreg csv ctypes ctypes.util dataclasses
datetime dbm dbm.dumb decimal difflib dis doctest email email.charset
email.contentmanager email.encoders email.errors email.feedparser
email.generator email.header email.headerregistry email.iterators
email.message email.parser email.policy email.utils enum errno faulthandler
filecmp fileinput fnmatch fractions ftplib functools gc genericpath getopt
getpass gettext glob graphlib gzip hashlib heapq hmac html html.entities
html.parser http http.client http.cookiejar http.cookies http.server imaplib
importlib importlib.abc importlib.machinery importlib.metadata
importlib.resources importlib.util inspect io ipaddress itertools json
json.decoder json.encoder keyword linecache locale logging logging.config
logging.handlers lzma mailbox marshal math mimetypes mmap modulefinder
multiprocessing multiprocessing.connection multiprocessing.context
multiprocessing.managers multiprocessing.pool multiprocessing.process
multiprocessing.queues multiprocessing.shared_memory
multiprocessing.sharedctypes multiprocessing.synchronize netrc ntpath
numbers opcode operator optparse os os.path pathlib pdb pickle pickletools
pkgutil platform plistlib poplib posixpath pprint profile pstats pty
py_compile pyclbr pydoc queue quopri random re reprlib rlcompleter runpy
sched secrets select selectors shelve shlex shutil signal site smtplib socket
socketserver sqlite3 ssl stat statistics string stringprep struct subprocess
symtable sys sysconfig tabnanny tarfile tempfile textwrap threading time
timeit token tokenize tomllib trace traceback tracemalloc types typing
unicodedata unittest unittest.case unittest.loader unittest.mock
unittest.result unittest.runner unittest.suite urllib.error urllib.parse
urllib.request urllib.response urllib.robotparser uuid warnings wave weakref
webbrowser wsgiref.handlers wsgiref.headers wsgiref.simple_server
wsgiref.util wsgiref.validate xml.dom xml.dom.minidom xml.etree.ElementTree
xml.parsers.expat xml.sax xml.sax.handler xml.sax.saxutils xmlrpc.client
xmlrpc.server zipapp zipfile zipimport zlib zoneinfo
""".split()
    )
)

TARGET_PROMPTS: tuple[str, ...] = (
    "The return statement",
    "A list comprehension",
    "Return a new",
    "The with statement",
)
DRAFT_PROMPTS: tuple[str, ...] = ("The return statement", "Return a new")


# --------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of one Llama model (all other settings are Llama defaults)."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_position_embeddings: int = 512


@dataclass(frozen=True)
class TrainSettings:
    """Optimisation settings for one model."""

    steps: int
    batch_size: int = 8
    seq_len: int = 256
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    eval_every: int = 100
    seed: int = 1234

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len


@dataclass(frozen=True)
class RunSettings:
    """Everything one invocation of the script needs."""

    out_dir: Path
    vocab_size: int
    val_fraction: float
    seed: int
    target: ModelSpec
    draft: ModelSpec
    target_train: TrainSettings
    draft_train: TrainSettings
    moe: MoeSpec = MOE_SPEC
    moe_train: TrainSettings | None = None
    only: tuple[str, ...] = ALL_MODELS  # the models this run trains; the others' records stay
    max_new_tokens: int = 24
    command: str = "python scripts/train_bundled.py"


@dataclass
class Corpus:
    """The documents of the corpus, split into train and validation."""

    train_docs: list[str]
    val_docs: list[str]
    sources: dict[str, Any] = field(default_factory=dict)

    @property
    def num_chars(self) -> int:
        return sum(len(d) for d in self.train_docs) + sum(len(d) for d in self.val_docs)


TARGET_SPEC = ModelSpec(
    "target", hidden_size=256, num_layers=6, num_heads=8, num_kv_heads=4, intermediate_size=768
)
DRAFT_SPEC = ModelSpec(
    "draft", hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=384
)


# --------------------------------------------------------------------------
# Corpus
# --------------------------------------------------------------------------


def import_quietly(name: str) -> Any:
    """Import a module while swallowing anything it prints or warns."""
    with (
        warnings.catch_warnings(),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        warnings.simplefilter("ignore")
        return importlib.import_module(name)


def public_members(obj: Any) -> Iterator[tuple[str, Any]]:
    """Public attributes of a module or class, sorted by name."""
    try:
        names = sorted(vars(obj))
    except TypeError:
        return
    for name in names:
        if name.startswith("_"):
            continue
        try:
            yield name, getattr(obj, name)
        except Exception:  # noqa: BLE001 - attribute access may raise anything
            continue


def documented_objects(module: Any) -> Iterator[Any]:
    """The module, then its public functions/classes and the classes' methods."""
    yield module
    for _, obj in public_members(module):
        if not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        if (
            getattr(obj, "__module__", None) not in (module.__name__, None)
            and module.__name__ != "builtins"
        ):
            continue  # re-exported from elsewhere: documented at its home
        yield obj
        if inspect.isclass(obj):
            for _, member in public_members(obj):
                if inspect.isroutine(member) or isinstance(member, property):
                    yield member


def safe_getdoc(obj: Any) -> str | None:
    """``inspect.getdoc`` that never raises."""
    try:
        return inspect.getdoc(obj)
    except Exception:  # noqa: BLE001
        return None


def stdlib_docstring_documents(modules: Iterable[str]) -> tuple[list[str], list[str]]:
    """Docstrings of the given modules' public API; returns (documents, failed modules)."""
    docs: list[str] = []
    failed: list[str] = []
    with warnings.catch_warnings():  # deprecated aliases warn on attribute access
        warnings.simplefilter("ignore")
        for name in modules:
            docs.extend(module_docstrings(name, failed))
    return docs, failed


def module_docstrings(name: str, failed: list[str]) -> list[str]:
    """Documents from one module; appends ``name`` to ``failed`` if it cannot be imported."""
    try:
        module = import_quietly(name)
    except Exception:  # noqa: BLE001 - platform-specific modules
        failed.append(name)
        return []
    docs: list[str] = []
    for obj in documented_objects(module):
        doc = safe_getdoc(obj)
        if doc and len(doc) >= 40:
            docs.extend(split_paragraph_groups(clean_text(doc)))
    return docs


def deduplicate(docs: Iterable[str]) -> list[str]:
    """Drop exact duplicates (inherited docstrings), keeping first occurrences."""
    seen: set[str] = set()
    unique: list[str] = []
    for doc in docs:
        if doc and doc not in seen:
            seen.add(doc)
            unique.append(doc)
    return unique


def build_corpus(val_fraction: float) -> Corpus:
    """Collect, clean, deduplicate and split the offline corpus."""
    topic_docs = pydoc_topic_documents()
    doc_docs, failed = stdlib_docstring_documents(STDLIB_MODULES)
    docs = deduplicate(topic_docs + doc_docs)
    train = [d for d in docs if not is_validation_doc(d, val_fraction)]
    val = [d for d in docs if is_validation_doc(d, val_fraction)]
    sources = {
        "pydoc_data_topics": {
            "documents": len(topic_docs),
            "characters": sum(map(len, topic_docs)),
        },
        "stdlib_docstrings": {
            "modules_requested": len(STDLIB_MODULES),
            "modules_failed": failed,
            "documents": len(doc_docs),
            "characters": sum(map(len, doc_docs)),
        },
        "documents_after_dedup": len(docs),
    }
    return Corpus(train_docs=train, val_docs=val, sources=sources)


# --------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------


def train_tokenizer(docs: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer and wrap it for transformers.

    ``<|endoftext|>`` is bos and eos (GPT-2 style: documents are separated by
    it, and the tokenizer prepends it to every encoded text so a prompt starts
    the way every training document does); ``<|pad|>`` is a separate padding
    token so attention masks stay visible.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[BOS_EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer)
    bos_id = tok.token_to_id(BOS_EOS_TOKEN)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS_EOS_TOKEN} $A",
        pair=f"{BOS_EOS_TOKEN} $A {BOS_EOS_TOKEN} $B",
        special_tokens=[(BOS_EOS_TOKEN, bos_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS_EOS_TOKEN,
        eos_token=BOS_EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=TARGET_SPEC.max_position_embeddings,
        clean_up_tokenization_spaces=False,
    )


def encode_stream(tokenizer: PreTrainedTokenizerFast, docs: list[str]) -> torch.Tensor:
    """Token ids of all documents, each preceded by ``<|endoftext|>``, plus a final one."""
    ids: list[int] = []
    for encoding in tokenizer.backend_tokenizer.encode_batch(docs):
        ids.extend(encoding.ids)  # the post-processor prepends <|endoftext|>
    ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def chunk_sequences(stream: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Cut a token stream into non-overlapping rows of ``seq_len`` tokens."""
    rows = stream.numel() // seq_len
    return stream[: rows * seq_len].view(rows, seq_len)


# --------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------


def build_model(
    spec: ModelSpec | MoeSpec, tokenizer: PreTrainedTokenizerFast, seed: int
) -> LlamaForCausalLM | Qwen3MoeForCausalLM:
    """A freshly initialised Llama model following ``spec`` (Qwen3-MoE for a MoeSpec)."""
    ids = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if isinstance(spec, MoeSpec):
        config, cls = moe_config(spec, len(tokenizer), ids), Qwen3MoeForCausalLM
    else:
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=spec.hidden_size,
            intermediate_size=spec.intermediate_size,
            num_hidden_layers=spec.num_layers,
            num_attention_heads=spec.num_heads,
            num_key_value_heads=spec.num_kv_heads,
            max_position_embeddings=spec.max_position_embeddings,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
            dtype="float32",
            **ids,
        )
        cls = LlamaForCausalLM
    torch.manual_seed(seed)
    model = cls(config)
    model.generation_config = GenerationConfig(**ids, do_sample=False, max_new_tokens=64)
    return model


def count_parameters(model: torch.nn.Module) -> int:
    """Unique parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def config_summary(model: LlamaForCausalLM) -> dict[str, Any]:
    """The architecture numbers worth showing in training.json."""
    c = model.config
    return {
        "architecture": "LlamaForCausalLM",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.hidden_size // c.num_attention_heads,
        "max_position_embeddings": c.max_position_embeddings,
        "tie_word_embeddings": c.tie_word_embeddings,
        "rope_parameters": dict(c.rope_parameters or {}),
        "rms_norm_eps": c.rms_norm_eps,
        "hidden_act": c.hidden_act,
    }


# --------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------


def learning_rate(step: int, s: TrainSettings) -> float:
    """Linear warmup, then cosine decay to ``min_lr_ratio * lr``."""
    if step < s.warmup_steps:
        return s.lr * (step + 1) / s.warmup_steps
    progress = (step - s.warmup_steps) / max(1, s.steps - s.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return s.lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * cosine)


def make_optimizer(model: torch.nn.Module, s: TrainSettings) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on norms)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": s.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=s.lr, betas=s.betas, eps=1e-8)


def batch_indices(num_rows: int, s: TrainSettings) -> Iterator[torch.Tensor]:
    """Row indices per step: shuffled epochs from a seeded generator."""
    gen = torch.Generator().manual_seed(s.seed)
    order = torch.empty(0, dtype=torch.long)
    while True:
        if order.numel() < s.batch_size:
            order = torch.cat([order, torch.randperm(num_rows, generator=gen)])
        yield order[: s.batch_size]
        order = order[s.batch_size :]


@torch.no_grad()
def evaluate(model: LlamaForCausalLM, rows: torch.Tensor, batch_size: int = 32) -> float:
    """Mean next-token cross-entropy (nats) over all validation rows."""
    model.eval()
    total, count = 0.0, 0
    for start in range(0, rows.shape[0], batch_size):
        batch = rows[start : start + batch_size]
        kw = {"output_router_logits": False} if is_moe(model) else {}  # the LM loss alone
        loss = model(input_ids=batch, labels=batch, **kw).loss
        n = batch.shape[0] * (batch.shape[1] - 1)
        total += loss.item() * n
        count += n
    model.train()
    return total / count


def train_model(
    model: LlamaForCausalLM, train_rows: torch.Tensor, val_rows: torch.Tensor, s: TrainSettings
) -> dict[str, Any]:
    """Train in place; returns a summary with losses and timings."""
    torch.manual_seed(s.seed)
    optimizer = make_optimizer(model, s)
    batches = batch_indices(train_rows.shape[0], s)
    history: list[dict[str, float]] = []
    recent: list[float] = []
    best: dict[str, Any] = {"val_loss": math.inf, "step": 0, "state": None}
    model.train()
    start = time.perf_counter()
    for step in range(s.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, s)
        batch = train_rows[next(batches)]
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
        optimizer.step()
        recent = (recent + [loss.item()])[-20:]
        if (step + 1) % s.eval_every == 0 or step + 1 == s.steps:
            val = evaluate(model, val_rows)
            elapsed = time.perf_counter() - start
            history.append(
                {
                    "step": step + 1,
                    "train_loss": sum(recent) / len(recent),
                    "val_loss": val,
                    "elapsed_s": round(elapsed, 1),
                }
            )
            print(
                f"  step {step + 1:5d}/{s.steps}  train {history[-1]['train_loss']:.3f}  "
                f"val {val:.3f}  ppl {math.exp(val):7.1f}  lr {learning_rate(step, s):.2e}  "
                f"{elapsed / (step + 1):.2f}s/step",
                flush=True,
            )
            if val < best["val_loss"]:
                best = {
                    "val_loss": val,
                    "step": step + 1,
                    "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
                }
    wall = time.perf_counter() - start
    if best["step"] != s.steps:  # validation loss went up again: keep the best checkpoint
        print(f"  restoring best checkpoint from step {best['step']}", flush=True)
        model.load_state_dict(best["state"])
    stride = max(1, train_rows.shape[0] // val_rows.shape[0])
    final_train = evaluate(model, train_rows[::stride])  # as many rows as validation
    final_val = best["val_loss"]
    return {
        "steps": s.steps,
        "batch_size": s.batch_size,
        "seq_len": s.seq_len,
        "tokens_per_step": s.tokens_per_step,
        "tokens_seen": s.steps * s.tokens_per_step,
        "epochs": round(s.steps * s.batch_size / train_rows.shape[0], 2),
        "optimizer": {
            "name": "AdamW",
            "lr": s.lr,
            "betas": list(s.betas),
            "weight_decay": s.weight_decay,
            "grad_clip": s.grad_clip,
            "schedule": f"linear warmup {s.warmup_steps} steps, cosine to {s.min_lr_ratio} x lr",
        },
        "seed": s.seed,
        "wall_time_s": round(wall, 1),
        "seconds_per_step": round(wall / s.steps, 3),
        "saved_checkpoint_step": best["step"],
        "final_train_loss_running": round(history[-1]["train_loss"], 4),
        "final_train_loss": round(final_train, 4),
        "final_val_loss": round(final_val, 4),
        "final_val_perplexity": round(math.exp(final_val), 2),
        "final_train_perplexity": round(math.exp(final_train), 2),
        "history": [
            {k: round(v, 4) if isinstance(v, float) else v for k, v in h.items()} for h in history
        ],
    }


# --------------------------------------------------------------------------
# Samples and output
# --------------------------------------------------------------------------


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


def parse_args(argv: list[str] | None = None) -> RunSettings:
    """Command-line flags -> RunSettings."""
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
