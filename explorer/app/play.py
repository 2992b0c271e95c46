"""Play: step the dashboard's session on a background thread until Pause, a stop, or max tokens.

    player = Player(dash, max_tokens_per_s=30.0, render_interval_s=0.5)
    player.play(); player.pause(); player.wait()

Steps are taken under the guard's lock and drawn in batches (one redraw per render interval); a
click waiting for the lock gets it between two steps. Play is paced: a page cannot draw faster
than about 30 tokens/s on a small machine, and an engine running flat out starves the browser
(measured on 2 cores: 107 tokens/s computed, 28 shown, 1.5 s behind, Pause lost). Each step's
latency is still timed alone; max_tokens_per_s=None runs flat out.
"""

from __future__ import annotations

import threading
import time

from explorer.app.messages import stop_text


class Player:
    def __init__(self, dash, max_tokens_per_s: float | None, render_interval_s: float):
        self.dash = dash
        self.max_tokens_per_s = max_tokens_per_s
        self.render_interval_s = render_interval_s
        self._pause = threading.Event()
        self.thread: threading.Thread | None = None

    def play(self) -> bool:
        """Start stepping on a background thread. False (with a message) if it could not start."""
        dash = self.dash
        if dash.session.done:
            dash.guard.say(
                f"The session has stopped: {stop_text(dash.session)}. Rewind or Reset first.",
                "info",
            )
            return False
        if not dash.guard.start("Play"):
            return False
        self._pause.clear()
        self.thread = threading.Thread(target=self._loop, name="explorer-play", daemon=True)
        self.thread.start()
        return True

    def pause(self) -> None:
        """Stop Play after the step in progress."""
        self._pause.set()

    def _loop(self) -> None:
        dash, guard = self.dash, self.dash.guard
        pending, count = [], 0
        try:
            dash.wait_peaks()
            start = due = last_render = time.perf_counter()
            while not self._pause.is_set():
                with guard.lock:
                    if dash.session.done:
                        break
                    t0 = time.perf_counter()
                    step = dash.session.step()
                    pending.append(step)
                    count += 1
                    now = time.perf_counter()
                    dash.timings.append(("play", step.index, now - t0, 0.0))
                    if now - last_render >= self.render_interval_s or dash.session.done:
                        dash.show_new_steps(pending)
                        pending, last_render = [], time.perf_counter()
                guard.yield_to_waiting()  # a click waiting for the lock gets it before the next step
                due = self._pace(due)
            with guard.lock:
                if pending:
                    dash.show_new_steps(pending)
            guard.say(self._summary(count, time.perf_counter() - start), "ok")
        except Exception as err:  # noqa: BLE001 - shown, and the session keeps every completed step
            with guard.lock:
                if pending:
                    dash.show_new_steps(pending)
            guard.fail(err, "Play")
        finally:
            guard.finish()

    def _summary(self, count: int, seconds: float) -> str:
        session = self.dash.session
        rate = count / max(seconds, 1e-9)
        pace = f", paced at up to {self.max_tokens_per_s:g}/s" if self.max_tokens_per_s else ""
        why = f": {stop_text(session)}" if session.done else ""
        return (
            f"Play {'stopped' if session.done else 'paused'} after {count} tokens ({rate:.1f} "
            f"tokens/s, charts included{pace}){why}."
        )

    def _pace(self, due: float) -> float:
        """Wait (Pause interrupts) until the next step is due at the Play pace; returns the time the
        one after it is due. A slow step is not made up for by a burst (no debt carried over)."""
        if not self.max_tokens_per_s:
            return due
        due = max(due + 1.0 / self.max_tokens_per_s, time.perf_counter())
        wait = due - time.perf_counter()
        if wait > 0:
            self._pause.wait(wait)
        return due
