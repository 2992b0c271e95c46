"""Inference Explorer: run a causal LM one forward pass at a time and see what each step does and costs.

    import explorer
    lm = explorer.load()                                    # the bundled target (offline)
    s = explorer.Session(lm, "The return statement", explorer.Sampling(temperature=0.7, top_p=0.9))
    s.step(); s.trace.to_json()

Rooms: model/ (what runs), engine/ (one request, step by step), costs/ (why a step takes its time),
sweeps/ (registered measurements), plots/ (figures), app/ (dashboard), cli/ (the `explorer` command),
bench/ (side-by-side benchmarks).
"""

from explorer._version import __version__
from explorer.engine.sampling import Sampling
from explorer.engine.trace import Step, Trace, TraceFormatError
from explorer.model import (
    DeviceNotAvailableError,
    LoadedModel,
    ModelInfo,
    ModelNotFoundError,
    available_models,
    load,
)

__all__ = [
    "DeviceNotAvailableError",
    "LoadedModel",
    "ModelInfo",
    "ModelNotFoundError",
    "Sampling",
    "Session",
    "SpeculativeSession",
    "PromptLookup",
    "PrefixCache",
    "Step",
    "Trace",
    "TraceFormatError",
    "available_models",
    "load",
    "__version__",
]


def __getattr__(name: str):
    # Session / SpeculativeSession import lazily so `import explorer` stays light.
    if name in ("Session", "SpeculativeSession", "PromptLookup", "PrefixCache"):
        from explorer import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'explorer' has no attribute {name!r}")
