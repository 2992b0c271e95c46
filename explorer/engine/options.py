"""The engine options of the optimisation ladder: which KV cache, whether the decode forward is
compiled, and (through explorer.model.quant) which weights.

    cache="dynamic"   transformers' DynamicCache: grows by torch.cat each step (a copy of the prefix).
    cache="static"    transformers' StaticCache: preallocated to `cache_len` positions and written in
                      place, so every decode pass has the same shapes (what torch.compile and CUDA
                      graphs need). kv_cache_bytes then reports the whole preallocated buffer.
    cache="fp8"       transformers' QuantizedCache (QUANTIZED_CACHES): K/V stored in float8 with one
                      scale per tensor; "int4:quanto" / "int4:hqq" group-wise int4 (their packages
                      must be installed, else CacheNotSupportedError says so). The cost model
                      counts their KV bytes at that dtype (explorer.costs.kvdtype).
    compile=True      torch.compile of the decode forward (one token per row): default Inductor on
                      CPU, mode "reduce-overhead" (CUDA graphs) on CUDA; a string names the mode.
                      The prefill runs eager (its shape differs each prompt).

Compile time is measured apart: before the first decode pass the compiled forward runs WARMUP_PASSES
times on a scratch copy of the cache (`compile_s`, in the Trace settings: the first pass compiles, the
second sees a new cache length and compiles once more with it marked dynamic, the third checks that
nothing more compiles); the Steps then time only their own pass.

What triggers a recompile (counted per Step in `recompiles`, from torch._dynamo's counters): a new
input shape, dtype or device. With the static cache a decode pass always has the same shapes, so
there is none after the first. With the dynamic cache the context grows every step: dynamo compiles
once more with the sequence length marked dynamic, then no more. A new batch size, a new cache
length or another model compiles again.

If compiling fails (no C compiler for Inductor, an op dynamo cannot trace, ...) the session falls
back to eager, warns once, and says so: Trace settings["compile"]["active"] is False with the
reason, and every Step has compiled=False.
"""

from __future__ import annotations

import warnings

import torch

# transformers' QuantizedCache: cache name -> (its backend, bits, the KV dtype the cost model counts,
# explorer.costs.kvdtype, and the package the backend needs). fp8 runs on torch alone (per-tensor
# scale); the group-wise integer backends need optimum-quanto or hqq.
QUANTIZED_CACHES = {
    "fp8": ("fp8", None, "fp8", None),
    "int4:quanto": ("quanto", 4, "int4", "optimum-quanto"),
    "int4:hqq": ("hqq", 4, "int4", "hqq"),
}
CACHE_TYPES = ("dynamic", "static", *QUANTIZED_CACHES)
WARMUP_PASSES = 3  # scratch decode passes before the first timed one (see the module docstring)
DEFAULT_STATIC_HEADROOM = (
    256  # positions a static cache leaves for new tokens without max_new_tokens
)


def check_cache_type(cache: str) -> str:
    if cache not in CACHE_TYPES:
        raise ValueError(f"cache must be one of {CACHE_TYPES}, got {cache!r}")
    return cache


def static_cache_len(
    prompt_len: int, max_new_tokens: int | None, max_positions: int, cache_len: int | None
) -> int:
    """The length of a static cache; ValueError (naming both lengths) when it cannot hold the run."""
    need = prompt_len + max_new_tokens if max_new_tokens is not None else None
    if cache_len is None:
        cache_len = need or prompt_len + DEFAULT_STATIC_HEADROOM
        if max_positions:
            cache_len = min(cache_len, max_positions)
    if not isinstance(cache_len, int) or isinstance(cache_len, bool) or cache_len < 1:
        raise ValueError(f"cache_len must be a whole number >= 1, got {cache_len!r}")
    if need is not None and cache_len < need:
        raise ValueError(
            f"the static cache holds {cache_len} positions but the run needs {need} "
            f"({prompt_len} prompt + {max_new_tokens} new tokens): raise cache_len or lower "
            "max_new_tokens"
        )
    if cache_len <= prompt_len:
        raise ValueError(
            f"the static cache holds {cache_len} positions but the prompt alone is {prompt_len}"
        )
    return cache_len


class CacheNotSupportedError(ValueError):
    """A cache type this machine cannot run (its backend package is missing)."""


def cache_kv_dtype(kind: str | None) -> str | None:
    """The KV dtype the cost model counts for a cache type (None: the weights')."""
    return QUANTIZED_CACHES[kind][2] if kind in QUANTIZED_CACHES else None


def quantized_cache(kind: str, model):
    """transformers' QuantizedCache for `kind`; CacheNotSupportedError when its backend is missing."""
    from transformers import QuantizedCache
    from transformers.utils import is_hqq_available, is_optimum_quanto_available

    backend, nbits, _, package = QUANTIZED_CACHES[kind]
    present = {"quanto": is_optimum_quanto_available, "hqq": is_hqq_available}
    if backend in present and not present[backend]():
        raise CacheNotSupportedError(
            f"the {kind} KV cache needs the {package} package, not installed here "
            f"(pip install {package})"
        )
    return QuantizedCache(backend, model.config, nbits=nbits)


def new_cache(kind: str, model, cache_len: int | None):
    from transformers import DynamicCache, StaticCache

    if kind in QUANTIZED_CACHES:
        return quantized_cache(kind, model)
    if kind == "static":
        return StaticCache(config=model.config, max_cache_len=cache_len)
    return DynamicCache()


def compile_mode(compile, device: torch.device) -> str | None:
    """None when off; the torch.compile mode otherwise ("default" on CPU, "reduce-overhead" on CUDA)."""
    if compile is False or compile is None:
        return None
    if compile is True:
        return "reduce-overhead" if device.type == "cuda" else "default"
    if isinstance(compile, str) and compile:
        return compile
    raise ValueError(f"compile must be False, True or a torch.compile mode name, got {compile!r}")


def graphs_compiled() -> int:
    """How many graphs dynamo has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class Compiled:
    """The compiled decode forward of one model and mode (cached on the model), and its state in a
    session: compile_s once warmed up, or the reason it fell back to eager."""

    def __init__(self, model, mode: str):
        self.mode = mode
        self.active = True
        self.reason: str | None = None
        self.compile_s: float | None = None
        self.graphs_at_warmup: int | None = None
        store = model.__dict__.get("_explorer_compiled")
        if store is None or store.get("owner") != id(model):
            # a copy of a compiled model (deepcopy, with_weights) carries its source's __dict__:
            # its compiled forward would run the source's weights, so it gets its own store
            store = model.__dict__["_explorer_compiled"] = {"owner": id(model)}
        if mode not in store:
            try:
                kw = {} if mode == "default" else {"mode": mode}
                store[mode] = torch.compile(model.forward, **kw)
            except Exception as err:  # noqa: BLE001  (any failure: fall back, say why)
                self._fail(err)
                return
        self.fn = store[mode]

    def _fail(self, err: BaseException) -> None:
        self.active = False
        self.reason = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"
        warnings.warn(
            f"torch.compile failed, running eager instead ({self.reason})",
            RuntimeWarning,
            stacklevel=4,
        )

    def warm_up(self, run, device: torch.device) -> None:
        """Run the compiled forward WARMUP_PASSES times (run(fn) does one pass) and time it,
        device-synchronised: the one-off compile time."""
        from explorer.costs.timing import time_call

        if self.compile_s is not None or not self.active:
            return
        before = graphs_compiled()
        try:
            _, self.compile_s = time_call(
                lambda: [run(self.fn) for _ in range(WARMUP_PASSES)], device
            )
        except Exception as err:  # noqa: BLE001
            self._fail(err)
            return
        self.graphs_at_warmup = graphs_compiled() - before

    def to_dict(self) -> dict:
        return {
            "mode": self.mode,
            "active": self.active,
            "reason": self.reason,
            "compile_s": self.compile_s,
            "graphs_at_warmup": self.graphs_at_warmup,
        }
