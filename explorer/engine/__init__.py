"""One request, one forward pass at a time: sampling, settings, the Session, its Trace, speculative decoding.

    from explorer.engine import Session, SpeculativeSession, Sampling, Trace, forward

Sampling and Trace are light (no transformers import); the rest loads on first use.
"""

from explorer.engine.sampling import Sampling
from explorer.engine.trace import Step, Trace, TraceFormatError

_LAZY = {
    "Session": "session",
    "SessionDone": "session",
    "SessionBusy": "session",
    "forward": "passes",
    "kv_cache_bytes": "passes",
    "crop_cache": "passes",
    "copy_cache": "passes",
    "position_ids": "passes",
    "overhead_benchmark": "session",
    "SpeculativeSession": "speculative",
    "Round": "speculative",
    "PromptLookup": "speculative",
    "PrefixCache": "prefix",
    "inside_benchmark": "session",
}

__all__ = ["Sampling", "Step", "Trace", "TraceFormatError", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"explorer.engine.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'explorer.engine' has no attribute {name!r}")
