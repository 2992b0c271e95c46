"""Serving engines: one interface, each a real way people serve a model.

    sequential   one request at a time through Session (first come, first served): the baseline
    static       up to B requests per batch through the batched Session (left padding); a batch
                 starts when full or after a wait limit and runs until its longest request ends
    continuous   transformers' own continuous-batching engine (paged KV cache, requests join and
                 leave every iteration), its scheduler recorded per iteration
    http         any OpenAI-compatible streaming server (vLLM, SGLang, TGI, llama.cpp,
                 `transformers serve`), timed from chunk arrivals as `vllm bench serve` does

An engine is one module here that registers itself: a Knobs dataclass declaring each of its knobs
once (range and help, with explorer.engine.settings.setting(), as Sampling does) and an Engine
class taking (lm, knobs) with
    check(requests)                       a clear ValueError before the run, if it cannot serve them
    serve(requests, records, feeder, stop) -> list[Iteration]   fills the records
The CLI flags, the Serving tab's controls, validation, the recorded result (describe()) and the
simulator's policy for the engine (explorer.serving.simulate.policy) all read the Knobs.
The Feeder (explorer.serving.engines._feed) sends requests at their arrival times behind the
concurrency limit; every engine shares it, so the same workload arrives the same way everywhere.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import asdict, dataclass
from typing import ClassVar

from explorer._registry import Registry
from explorer.engine.settings import Spec, specs, validate

ENGINES: Registry[type] = Registry("engine")


@dataclass
class Knobs:
    """An engine's knobs: subclasses declare each one with setting(); validated when built."""

    engine: ClassVar[str] = "?"  # set by register()
    batch_knob: ClassVar[str | None] = None  # the knob that limits requests per batch, if any
    kv_knob: ClassVar[str | None] = None  # the knob that sets the KV cache's budget, if any

    def __post_init__(self) -> None:
        try:
            validate(self)
        except ValueError as err:
            raise ValueError(f"{self.engine} engine: {err}") from None

    @classmethod
    def specs(cls) -> dict[str, Spec]:
        return specs(cls)

    def to_dict(self) -> dict:
        return asdict(self)


class Engine:
    """What every engine shares: its name, its Knobs, the model it serves, describe() and check()."""

    name: ClassVar[str]
    Knobs: ClassVar[type[Knobs]]
    local: ClassVar[bool] = True  # runs the loaded model in this process (else lm is optional)

    def __init__(self, lm, knobs: Knobs, *, ignore_eos: bool = True):
        if self.local and lm is None:
            raise ValueError(f"the {self.name} engine needs a loaded model")
        self.lm, self.knobs, self.ignore_eos = lm, knobs, ignore_eos

    def describe(self) -> dict:
        """What the result records: the engine's name and its knobs."""
        return {"engine": self.name, **self.knobs.to_dict()}

    def check(self, requests) -> None:
        check_lengths(self.lm, requests)


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


def register(name: str, knobs: type[Knobs], *, order: int):
    """Class decorator: the engine `name`, configured by `knobs`, listed by `order`."""

    def wrap(cls):
        cls.name, cls.Knobs, cls.order = name, knobs, order
        knobs.engine = name
        ENGINES.add(name, cls)
        return cls

    return wrap


def names(local_only: bool = False) -> tuple[str, ...]:
    """The registered engines in their order (local_only: those that run the loaded model)."""
    return tuple(e.name for e in ENGINES.values() if e.local or not local_only)


def get(name: str) -> type[Engine]:
    return ENGINES.get(name)


def knob_table(engine_names: tuple[str, ...]) -> dict[str, tuple]:
    """{knob: (its Spec, its default, the engines that take it)} over these engines, in order:
    what the CLI flags and the Serving tab's controls are built from."""
    out: dict[str, tuple] = {}
    for name in engine_names:
        defaults = get(name).Knobs()
        for knob, spec in defaults.specs().items():
            out.setdefault(knob, (spec, getattr(defaults, knob), []))[2].append(name)
    return out


def _split(name: str, given: dict) -> tuple[dict, dict]:
    """(the knobs in `given`, the engine's other constructor keywords; ValueError on anything else)."""
    cls = get(name)
    fields = [f.name for f in dataclasses.fields(cls.Knobs)]
    keywords = set(inspect.signature(cls.__init__).parameters) - {"self", "lm", "knobs"}
    unknown = sorted(set(given) - set(fields) - keywords)
    if unknown:
        raise ValueError(
            f"the {name} engine has no knob {', '.join(unknown)}; its knobs are "
            f"{', '.join(fields) or 'none'}"
        )
    return {k: v for k, v in given.items() if k in fields}, {
        k: v for k, v in given.items() if k not in fields
    }


def knobs_of(name: str, given: dict) -> tuple[Knobs, dict]:
    """(the engine's validated Knobs from the knob names in `given`, the rest of `given`: keywords
    of the engine's constructor such as ignore_eos; ValueError naming anything else)."""
    values, rest = _split(name, given)
    return get(name).Knobs(**values), rest


def make(name: str, lm=None, knobs: Knobs | None = None, **given):
    """An engine by name, with a Knobs object or knob keywords (ValueError naming a knob it does
    not take); other keywords (ignore_eos, ...) go to the engine's constructor."""
    cls = get(name)
    if knobs is None:
        knobs, given = knobs_of(name, given)
    elif not isinstance(knobs, cls.Knobs):
        raise ValueError(
            f"the {name} engine takes {cls.Knobs.__name__}, not {type(knobs).__name__}"
        )
    elif _split(name, given)[0]:
        raise ValueError("give an engine's knobs as a Knobs object or as keywords, not both")
    return cls(lm, knobs, **given)


def check_lengths(lm, requests) -> None:
    """Every request fits the model's context (prompt + max_tokens <= max positions) and its
    vocabulary."""
    check_vocabulary(lm, requests)
    check_context(lm.info, requests)


def check_context(info, requests) -> None:
    """Refuse a request whose prompt plus output is past the model's context window (the real
    engines' check and the simulator's)."""
    for r in requests:
        info.check_context(
            len(r.prompt_ids) + r.max_tokens,
            f"request {r.id} ({len(r.prompt_ids)} prompt + {r.max_tokens} new tokens)",
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


ENGINES.discover(__name__)
NAMES = names()
