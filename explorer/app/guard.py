"""One wrapper for every callback: errors become a readable message, a busy flag stops conflicts.

    guard = Guard(message_widget, on_finish=refresh_controls)
    button.on_click(guard.action("step", do_step))      # a plain callback
    guard.start("play")  ...  guard.finish()            # a long run on a background thread

An action that raises leaves what it had not yet swapped in untouched (callbacks build new objects
first and only swap on success), shows the error in the message area and re-enables controls.
While a run ("play", a sweep) holds the busy flag, conflicting actions are refused with a message.
"""

from __future__ import annotations

import concurrent.futures
import html
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from explorer.model.device import is_out_of_memory


def describe(err: BaseException, doing: str = "") -> str:
    """A short, readable account of an error for the message area (plain text)."""
    what = f"{doing} failed: " if doing else ""
    if is_out_of_memory(err):
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        return (
            f"Out of memory{' while ' + doing if doing else ''}. Nothing was changed: the session and "
            "charts are as they were. Try a smaller batch size, a shorter prompt or max tokens, or a "
            f"smaller model. ({first})"
        )
    text = str(err).strip() or type(err).__name__
    if isinstance(err, (ValueError, KeyError, TypeError, LookupError)):
        return f"{what}{text}"
    return f"{what}{type(err).__name__}: {text}"


def message_html(text: str, kind: str = "info") -> str:
    """HTML for the message area: kind is 'info', 'ok', 'busy' or 'error'."""
    colors = {
        "info": ("#f4f6f8", "#333"),
        "ok": ("#eef7ee", "#225522"),
        "busy": ("#fff8e1", "#6d5200"),
        "error": ("#fdecea", "#8a1c1c"),
    }
    bg, fg = colors.get(kind, colors["info"])
    body = html.escape(text).replace("\n", "<br>")
    return (
        f'<div class="ie-message-{kind}" style="background:{bg};color:{fg};padding:6px 10px;'
        f'border-radius:4px;min-height:1.4em;white-space:normal">{body}</div>'
    )


class Guard:
    """Runs callbacks safely: one at a time, errors shown, controls re-enabled afterwards."""

    def __init__(self, message, on_finish: Callable[[], None] | None = None):
        self.message = message  # an ipywidgets.HTML
        self.on_finish = on_finish
        self.lock = threading.RLock()  # held while the session or the charts change
        self.busy: str | None = None  # the long run in progress ("play", "sweep: cache", ...)
        self.last_error: str | None = None
        self.traceback = ""
        self.errors: list[
            str
        ] = []  # tracebacks of every error shown (most recent last), for debugging
        self._flag = threading.Lock()  # guards the busy flag's check-and-set
        self.waiting = 0  # callbacks blocked on the lock (a long run yields to them between steps)

    # --- messages ------------------------------------------------------------------------------

    def say(self, text: str, kind: str = "info") -> None:
        self.message.value = message_html(text, kind)
        if kind == "error":
            self.last_error = text

    def fail(self, err: BaseException, doing: str = "") -> None:
        self.say(describe(err, doing), "error")
        self.traceback = "".join(traceback.format_exception(type(err), err, err.__traceback__))
        self.errors.append(self.traceback)

    # --- actions -------------------------------------------------------------------------------

    def action(
        self, doing: str, fn: Callable[..., Any], *, while_busy: bool = False
    ) -> Callable[..., Any]:
        """Wrap fn for on_click / observe: refused while a run is busy (unless while_busy), errors shown."""

        def run(*args, **kwargs):
            return self.call(doing, fn, *args, while_busy=while_busy, **kwargs)

        run.__name__ = getattr(fn, "__name__", "action")
        return run

    def call(
        self, doing: str, fn: Callable[..., Any], *args, while_busy: bool = False, **kwargs
    ) -> Any:
        if self.busy and not while_busy:
            self.say(
                f"{self.busy} is running: press Pause (or wait for it to finish) before {doing}.",
                "busy",
            )
            return None
        if not self.lock.acquire(blocking=False):
            if not while_busy:
                self.say(f"still working on the previous action; {doing} was not started.", "busy")
                return None
            self.waiting += 1
            try:
                self.lock.acquire()
            finally:
                self.waiting -= 1
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - every error becomes a message; the app stays usable
            self.fail(err, doing)
            return None
        finally:
            self.lock.release()
            self._finished()

    def yield_to_waiting(self, timeout: float = 1.0) -> None:
        """Called by a long run between steps, lock released: let waiting callbacks in first
        (Python's locks are not fair, so a loop that re-takes the lock at once would starve them)."""
        end = time.monotonic() + timeout
        while self.waiting and time.monotonic() < end:
            time.sleep(0.001)

    def start(self, what: str) -> bool:
        """Claim the busy flag for a long run; False (with a message) if another run holds it."""
        with self._flag:  # not self.lock: a run in progress holds that for a whole step
            if self.busy:
                self.say(f"{self.busy} is already running.", "busy")
                return False
            self.busy = what
        self._finished()
        return True

    def finish(self) -> None:
        self.busy = None
        self._finished()

    def _finished(self) -> None:
        if self.on_finish is not None:
            try:
                self.on_finish()
            except Exception as err:  # noqa: BLE001
                self.say(describe(err, "refreshing the controls"), "error")


_ENGINE: concurrent.futures.ThreadPoolExecutor | None = None


def on_engine_thread(fn, *args):
    """Run fn(*args) on the one engine worker thread and wait for it (exceptions propagate).

    Forward passes then always run on the same non-main thread, as Play's do. Measured here on a
    shared 2-core CPU under load: a bundled-target decode step took 260-1200 ms (median of 20) on the
    kernel's main thread against ~10 ms on a worker thread, same torch thread count (OpenMP's
    main-thread team waits badly when the cores are oversubscribed); on an idle machine both match.
    """
    global _ENGINE
    if threading.current_thread() is not threading.main_thread():
        return fn(*args)  # already off the main thread (Play, a sweep)
    if _ENGINE is None:
        _ENGINE = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="explorer-engine"
        )
    return _ENGINE.submit(fn, *args).result()
