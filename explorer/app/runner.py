"""A tab's long action on a background thread: the one way every tab that starts a run runs it.

    runner = Runner(tab, "The pays sweep", controls=[trick, values, run], stop=stop, progress=bar)
    runner.start("Running kv-cache… (Stop keeps the rows so far)", work, lm, kwargs)
    # work(lm, kwargs) runs on a daemon thread; it reads runner.stop_event, calls runner.tick(done,
    # total) and ends with runner.finished(text, partial=...)

The runner owns what each tab used to write for itself: the guard's busy flag (one run at a time,
refused with a message while another holds it), the busy message, disabling the controls that
conflict (and enabling this run's Stop while it runs), the daemon thread (dash.wait() joins it
through Tab.threads), the stop event, the progress bar, and the partial-result marking: a stopped
run's closing line says what was kept, and an error says how far the run had come.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence


class Runner:
    """One background run of a tab (a tab may hold several: each has its own Stop)."""

    def __init__(
        self,
        tab,
        doing: str,
        *,
        controls: Sequence = (),
        stop=None,
        progress=None,
        stopping: str = "Stopping after the current point…",
        unit: str = "points",
    ):
        self.dash = tab.dash
        self.doing = doing  # "The pays sweep": how a refusal and an error name the run
        self.controls = list(controls)  # off while any run holds the guard's busy flag
        self.stop_button, self.progress = stop, progress
        self.stopping, self.unit = stopping, unit
        self.thread: threading.Thread | None = None
        self.stop_event = threading.Event()
        self.active = False  # True while this runner's run is on
        self.done = self.total = 0  # the progress so far (tick)
        if stop is not None:
            stop.on_click(lambda _: self.stop())
        tab.runners.append(self)

    def set_busy(self, busy: bool) -> None:
        """Controls off while a run (any) is busy; this run's Stop on only while it runs."""
        for w in self.controls:
            w.disabled = busy
        if self.stop_button is not None:
            self.stop_button.disabled = not (busy and self.active)

    def start(self, message: str, work: Callable, *args, doing: str | None = None) -> bool:
        """Claim the guard, say `message` (busy) and run work(*args) on a daemon thread; False
        (with a message) if another run holds the guard."""
        doing = doing or self.doing
        g = self.dash.guard
        if not g.start(doing):
            return False
        self.stop_event.clear()
        self.active, self.done, self.total = True, 0, 0
        if self.progress is not None:
            self.progress.value = 0
        g.say(message, "busy")
        self.thread = threading.Thread(
            target=self._run, args=(doing, work, args), name=f"explorer-{_slug(doing)}", daemon=True
        )
        self.set_busy(True)  # before the start: a run that fails at once re-enables the controls
        self.thread.start()
        return True

    def _run(self, doing: str, work: Callable, args: tuple) -> None:
        g = self.dash.guard
        try:
            work(*args)
        except Exception as err:  # noqa: BLE001 - shown; the views keep what they drew
            far = f" (after {self.done} of {self.total} {self.unit})" if self.done else ""
            g.fail(err, doing + far)
        finally:
            self.active = False
            g.finish()

    def stop(self) -> None:
        """Ask the run to stop at its next check (what finished is kept and drawn)."""
        self.stop_event.set()
        self.dash.guard.say(self.stopping, "busy")

    def tick(self, done: int, total: int) -> None:
        """Progress: `done` of `total` (the bar, and how far an error says the run came)."""
        self.done, self.total = done, total
        if self.progress is not None:
            self.progress.max, self.progress.value = max(total, 1), done

    def finished(self, text: str, *, partial: bool | None = None, notes: bool = False) -> None:
        """The closing line: ok, or info if the run has notes or is partial (marked so); partial
        None: the run is partial if Stop was pressed."""
        stopped = self.stop_event.is_set()
        partial = stopped if partial is None else partial
        suffix = (
            f" (partial: {'stopped, ' if stopped else ''}what finished is kept)" if partial else ""
        )
        self.dash.guard.say(text + suffix, "info" if partial or notes else "ok")


def _slug(doing: str) -> str:
    return "-".join(w for w in doing.lower().split() if w != "the")[:40]
