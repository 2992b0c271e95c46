"""One loaded model, many users: one forward pass at a time per model.

A transformers model is not safe to run from two threads at once: its forward wrapper sets
`config.is_causal` for one call and puts back what it saw (a concurrent call saves the other's
value as the "original"), and hooks registered for one pass (the logit lens, attention) fire on
every pass. So every forward path in the explorer takes the model's own re-entrant lock:

    with model_lock(lm.model):      # Session steps, replays and inside views, serving engines
        ...
    with exclusive_run(lm.model):   # a run on another thread (continuous batching): the whole run,
        ...                         # and config.is_causal as it was before, restored after

The lock lives in a weak table keyed by the model (a deep copy of the model gets its own).
"""

from __future__ import annotations

import threading
import weakref
from contextlib import contextmanager

_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_TABLE = threading.Lock()
_MISSING = object()


def model_lock(model) -> threading.RLock:
    """The re-entrant lock every forward pass on `model` holds (created on first use)."""
    with _TABLE:
        lock = _LOCKS.get(model)
        if lock is None:
            lock = _LOCKS[model] = threading.RLock()
        return lock


@contextmanager
def exclusive_run(model):
    """Hold the model's lock for a whole run and restore `config.is_causal` after it."""
    config = getattr(model, "config", None)
    before = getattr(config, "is_causal", _MISSING) if config is not None else _MISSING
    with model_lock(model):
        try:
            yield
        finally:
            if config is not None:
                if before is _MISSING:
                    if "is_causal" in vars(config):
                        del config.is_causal
                else:
                    config.is_causal = before
