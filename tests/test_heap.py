"""explorer._heap.new_objects_only: collections inside walk only new objects, and still free the
cyclic garbage made inside; the frozen objects come back on exit."""

from __future__ import annotations

import gc
import threading
import weakref

from explorer._heap import new_objects_only


class _Node:
    pass


def _cycle():
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_garbage_made_inside_is_collected_and_old_objects_are_not_walked():
    before = gc.get_freeze_count()
    old = _cycle()  # garbage made before: frozen, so not collected inside
    with new_objects_only():
        assert gc.get_freeze_count() > before
        new = _cycle()
        gc.collect()
        assert new() is None, "cyclic garbage made inside was not freed"
        assert old() is not None, "an object frozen at entry was walked"
    assert gc.get_freeze_count() == before
    gc.collect()
    assert old() is None, "the frozen garbage came back to the collector on exit"


def test_nested_and_threaded_uses_unfreeze_once_at_the_last_exit():
    before = gc.get_freeze_count()
    inside = threading.Event()
    leave = threading.Event()

    def other():
        with new_objects_only():
            inside.set()
            leave.wait(5)

    with new_objects_only():
        t = threading.Thread(target=other)
        t.start()
        assert inside.wait(5)
        with new_objects_only():
            frozen = gc.get_freeze_count()
        assert gc.get_freeze_count() == frozen > before  # the inner exit kept the freeze
    assert gc.get_freeze_count() > before  # the other thread's context is still open
    leave.set()
    t.join(5)
    assert gc.get_freeze_count() == before
