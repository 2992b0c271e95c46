"""Inference Explorer: run a causal LM one forward pass at a time and see what each step does and costs.

    import explorer
    lm = explorer.load()                                    # the bundled target (offline)
    s = explorer.Session(lm, "The return statement", explorer.Sampling(temperature=0.7, top_p=0.9))
    s.step(); s.trace.to_json()

Rooms: model/ (what runs), engine/ (one request, step by step), inside/ (hooks, the logit lens,
attention inside one pass), costs/ (why a step takes its time), serving/ (many requests: workloads,
engines, scenarios, the simulator), sweeps/ (registered measurements, the pays sweep),
bench/ (side-by-side benchmarks), plots/ (figures), app/ (dashboard), cli/ (the `explorer` command).
One home for each idea, at the top: _registry (the one Registry), _dtypes (the dtype table),
_format (how a figure is written, a missing one too), _stats (the one percentile), _heap
(garbage collection that walks only what a run made).
"""

from explorer._version import __version__

# Every name imports lazily (torch comes with the first one), so `import explorer` stays light and
# the `explorer` command can answer Ctrl-C during start-up with one line (explorer.cli.main).
_HOMES = {
    "Sampling": "explorer.engine.sampling",
    "Step": "explorer.engine.trace",
    "Trace": "explorer.engine.trace",
    "TraceFormatError": "explorer.engine.trace",
    "DeviceNotAvailableError": "explorer.model",
    "LoadedModel": "explorer.model",
    "ModelInfo": "explorer.model",
    "ModelNotFoundError": "explorer.model",
    "available_models": "explorer.model",
    "load": "explorer.model",
    "Session": "explorer.engine",
    "SpeculativeSession": "explorer.engine",
    "PromptLookup": "explorer.engine",
    "PrefixCache": "explorer.engine",
}

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
    import importlib

    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    try:  # a room (explorer.model, explorer.costs, ...) reached as an attribute
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError:
        raise AttributeError(f"module 'explorer' has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted(__all__)
