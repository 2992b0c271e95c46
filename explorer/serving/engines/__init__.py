"""Serving engines: one interface, each a real way people serve a model.

    sequential   one request at a time through Session (first come, first served): the baseline
    static       up to B requests per batch through the batched Session (left padding); a batch
                 starts when full or after a wait limit and runs until its longest request ends
    continuous   transformers' own continuous-batching engine (paged KV cache, requests join and
                 leave every iteration), its scheduler recorded per iteration
    http         any OpenAI-compatible streaming server (vLLM, SGLang, TGI, llama.cpp,
                 `transformers serve`), timed from chunk arrivals as `vllm bench serve` does

An engine is a class registered under its name with:
    check(requests)                       a clear ValueError before the run, if it cannot serve them
    serve(requests, records, feeder, stop) -> list[Iteration]   fills the records
The Feeder (explorer.serving.engines._feed) sends requests at their arrival times behind the
concurrency limit; every engine shares it, so the same workload arrives the same way everywhere.
"""

from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass

_ENGINES: dict[str, type] = {}
_MODULES = {
    "sequential": "sequential",
    "static": "static",
    "continuous": "continuous",
    "http": "http",
}
NAMES = tuple(_MODULES)


@dataclass
class Iteration:
    """One engine iteration (one forward pass over the batch), as the engine's own state shows it."""

    index: int
    start_s: float
    end_s: float
    decode_requests: int  # requests that produced a token from a one-token query
    prefill_requests: int  # requests whose prompt (or a chunk of it) was in this pass
    prefill_tokens: int  # prompt tokens processed in this pass
    batch_tokens: int  # query tokens in the pass (decode + prefill; padding included for static)
    waiting: int | None = None  # requests sent but not yet scheduled
    kv_blocks_used: int | None = None  # continuous: paged-cache blocks in use after the pass
    kv_blocks_total: int | None = None
    preempted: int = 0  # continuous: requests evicted (offloaded or reset) before this pass
    # [query tokens, past KV tokens] of each request in the pass (what the step-time model reads)
    passes: list[list[int]] | None = None

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s

    def to_dict(self) -> dict:
        return asdict(self)


def register(name: str):
    def wrap(cls):
        cls.name = name
        _ENGINES[name] = cls
        return cls

    return wrap


def get(name: str) -> type:
    if name not in _MODULES:
        raise ValueError(f"unknown engine {name!r}; the engines are {', '.join(NAMES)}")
    importlib.import_module(f"{__name__}.{_MODULES[name]}")
    return _ENGINES[name]


def make(name: str, lm=None, **knobs):
    """An engine by name with its knobs (ValueError naming a knob it does not take)."""
    cls = get(name)
    try:
        return cls(lm, **knobs) if name != "http" else cls(**knobs, lm=lm)
    except TypeError as err:
        raise ValueError(f"engine {name}: {err}") from None


def check_lengths(lm, requests) -> None:
    """Every request fits the model's context (prompt + max_tokens <= max positions) and its
    vocabulary."""
    check_vocabulary(lm, requests)
    limit = lm.info.max_positions
    for r in requests:
        if limit and len(r.prompt_ids) + r.max_tokens > limit:
            raise ValueError(
                f"request {r.id} asks for {len(r.prompt_ids)} prompt + {r.max_tokens} new tokens, "
                f"more than {lm.info.name}'s context of {limit} positions"
            )


def check_vocabulary(lm, requests) -> None:
    """Every prompt token id is one the model has (0 to vocab_size - 1)."""
    vocab = lm.info.vocab_size
    for r in requests:
        bad = [t for t in r.prompt_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(
                f"request {r.id} has token ids {bad[:3]} outside {lm.info.name}'s vocabulary "
                f"(0 to {vocab - 1})"
            )
