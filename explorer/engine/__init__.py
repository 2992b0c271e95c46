"""One request, one forward pass at a time: sampling, settings, the Session, its Trace, speculative decoding.

    from explorer.engine import Session, SpeculativeSession, Sampling, Trace, forward

Sampling and Trace are light (no transformers import); the rest loads on first use.
"""

from explorer.engine.sampling import Sampling
from explorer.engine.trace import Step, Trace, TraceFormatError

_LAZY = {  # name -> the module that defines it, imported on first use
    "Session": "explorer.engine.session",
    "SessionDone": "explorer.engine.session",
    "SessionBusy": "explorer.engine.session",
    "forward": "explorer.model.passes",
    "kv_cache_bytes": "explorer.model.passes",
    "crop_cache": "explorer.model.passes",
    "copy_cache": "explorer.model.passes",
    "position_ids": "explorer.model.passes",
    "SpeculativeSession": "explorer.engine.speculative",
    "Round": "explorer.engine.speculative",
    "PromptLookup": "explorer.engine.drafts",
    "PrefixCache": "explorer.engine.prefix",
}

__all__ = ["Sampling", "Step", "Trace", "TraceFormatError", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'explorer.engine' has no attribute {name!r}")
