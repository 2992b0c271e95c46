"""Garbage collection that scans only what a run made.

A full `gc.collect()` walks every tracked object of the process: with torch, transformers and the
dashboard's libraries imported that is ~0.4-1 s on this 2-core machine, and both a sweep (between
points, to hand the last point's memory back) and transformers' continuous-batching manager (twice
per run, at stop and when its batch processor is dropped) call it. Inside `new_objects_only()` the
objects that existed before it are frozen (`gc.freeze`), so those collections scan only the objects
made inside: the garbage a point or a run leaves is still freed (it was made inside), the process's
long-lived objects are not walked again. On exit the frozen objects go back to the oldest
generation (`gc.unfreeze`), where the next ordinary full collection sees them as before.

Nested uses freeze once: only the outermost context unfreezes. A process that froze objects on its
own (the memory-wall probe's child) is left as it is.
"""

from __future__ import annotations

import gc
import threading
from contextlib import contextmanager

_LOCK = threading.Lock()
_DEPTH = 0  # contexts open, in any thread
_FROZE = False  # whether the first of them froze (the last to close unfreezes)


@contextmanager
def new_objects_only():
    """Collections inside scan only objects made inside (see the module docstring)."""
    global _DEPTH, _FROZE
    with _LOCK:
        if _DEPTH == 0:
            _FROZE = gc.get_freeze_count() == 0
            if _FROZE:
                gc.freeze()
        _DEPTH += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0 and _FROZE:
                gc.unfreeze()
                _FROZE = False
