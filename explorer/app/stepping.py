"""The stepping panel of the Dashboard: Step, Play, Pause, Rewind, Reset, the token strip and the
distribution of one step (click a bar to branch, click the strip to inspect a step).

One idea: walking a Session one token at a time and showing each step as it comes. The Dashboard
(explorer.app.dashboard, the shell: settings, sessions, tabs, export) mixes this panel in; every
action is one call into the engine (session.step(), fork/rewind/choose) and then a re-render.
"""

from __future__ import annotations

import collections
import time

import ipywidgets as W

from explorer import plots
from explorer.app import controls, messages
from explorer.app.guard import on_engine_thread
from explorer.app.messages import stop_text
from explorer.app.peaks import known_chips
from explorer.app.views import Distribution, LiveChart, StripText, figure_widget
from explorer.engine.sampling import Sampling


class SteppingPanel:
    """The Dashboard's stepping panel (a mixin: it reads the shell's session, guard, run settings,
    buttons and tab list; explorer.app.dashboard.Dashboard builds it in _build_widgets)."""

    # --- building the panel ------------------------------------------------------------------------

    def _init_stepping(self, player) -> None:
        """The panel's state: Play's runner, the step in view, the colouring, the timings."""
        self.player = player  # explorer.app.play.Player: Play's background loop
        self.selected: int | None = None  # the step the distribution shows; None = the latest
        self.color_by = "prob"
        self.timings: collections.deque = collections.deque(maxlen=5000)  # (kind, step, s, s)
        self._ceilings_shown = False  # the tabs were told the machine's peaks

    def _build_stepping(self) -> None:
        """The panel's own widgets: Step, Play, Pause, Rewind, Reset, the step count, the colouring
        toggle, the step inspector, the token strip (text and chart) and the distribution."""
        self.button_parts = controls.buttons()
        self.step_count = W.HTML(value="step 0")
        self.step_count.add_class("ie-step-count")
        self.color_toggle = W.ToggleButtons(
            options=[("probability", "prob"), ("entropy", "entropy")],
            value="prob",
            style={"button_width": "90px"},
        )
        self.color_toggle.add_class("ie-color-by")
        self.inspect = W.IntText(
            value=0,
            description="inspect step",
            continuous_update=False,
            layout=W.Layout(width="170px"),
            style={"description_width": "80px"},
        )
        self.inspect.add_class("ie-inspect")

        self.strip_text = StripText()
        self.strip_text.set_prompt(self.run_settings.prompt)
        self.noise_note = W.HTML(value="")
        self.noise_note.add_class("ie-noise-note")
        self._show_noise_note()
        self.strip = LiveChart(
            figure_widget(plots.strip_figure, self.color_by),
            lambda s: plots.strip_columns(s, self.color_by),
            "strip-chart",
            keep_last=plots.STRIP_WINDOW,
        )
        self.dist = Distribution()
        self.dist.show(None, None)

    def _stepping_panel(self) -> W.VBox:
        """The panel laid out: the bar of buttons, the strip (its note, text and chart), the
        distribution."""
        self.strip_box = W.VBox(
            [self.noise_note, self.strip_text.widget, self.strip.fig],
            layout=W.Layout(width="100%"),
        )
        self.strip_box.add_class("ie-strip")
        return W.VBox(
            [self._stepping_bar(), self.strip_box, self.dist.widget],
            layout=W.Layout(flex="1 1 auto", min_width="0"),
        )

    def stepping_parts(self) -> dict[str, W.Widget]:
        """The panel's parts by name (CSS class ie-<name>)."""
        return {
            **self.button_parts,
            "strip": self.strip_box,
            "strip-text": self.strip_text.widget,
            "noise-note": self.noise_note,
            "strip-chart": self.strip.fig,
            "step-count": self.step_count,
            "color-by": self.color_toggle,
            "inspect": self.inspect,
            "dist": self.dist.fig,
            "dist-title": self.dist.title,
        }

    def _refresh_stepping(self) -> None:
        """The buttons' state: all off while a run is busy (Pause on while Play runs); Step and
        Play off once the session has stopped."""
        busy = self.guard.busy is not None
        buttons, stopped = self.button_parts, self.session.done
        for name in ("step", "rewind", "reset"):
            buttons[name].disabled = busy
        buttons["step"].disabled = busy or stopped
        buttons["play"].disabled = busy or stopped
        buttons["pause"].disabled = not (busy and self.guard.busy == "Play")

    def _stepping_bar(self) -> W.HBox:
        """The row above the strip: Step, Play, Pause, Rewind, Reset, the count and the toggles."""
        buttons = self.button_parts
        return W.HBox(
            [
                buttons["step"],
                buttons["play"],
                buttons["pause"],
                buttons["rewind"],
                buttons["reset"],
                self.step_count,
                self.color_toggle,
                self.inspect,
            ],
            layout=W.Layout(align_items="center", flex_flow="row wrap"),
        )

    def _wire_stepping(self) -> None:
        """The panel's callbacks: the buttons, the toggles, a click on the strip, on a bar."""
        g, buttons = self.guard, self.button_parts
        buttons["step"].on_click(g.action("Step", lambda _: self.step()))
        buttons["play"].on_click(lambda _: self.play())
        buttons["pause"].on_click(lambda _: self.pause())
        buttons["rewind"].on_click(g.action("Rewind", lambda _: self.rewind()))
        buttons["reset"].on_click(g.action("Reset", lambda _: self.reset()))
        self.color_toggle.observe(
            lambda ch: (
                self._quiet or g.call("Colouring", self.set_color_by, ch["new"], while_busy=True)
            ),
            names="value",
        )
        self.inspect.observe(
            lambda ch: self._quiet or g.call("Inspect", self.select, ch["new"], while_busy=True),
            names="value",
        )
        self.strip.fig.data[0].on_click(self._on_strip_click)
        final = next(t for t in self.dist.fig.data if t.name == "final")
        raw = next(t for t in self.dist.fig.data if t.name == "raw")
        final.on_click(self._on_bar_click)
        raw.on_click(self._on_bar_click)

    # --- the core actions (each is one call into the engine, then a re-render) --------------------------

    def step(self):
        """One forward pass; returns its Step (None when the session has stopped)."""
        if self.session.done:
            self.guard.say(
                f"The session has stopped: {stop_text(self.session)}. Rewind or Reset to go on.",
                "info",
            )
            return None
        self.wait_peaks()
        t0 = time.perf_counter()
        step = on_engine_thread(self.session.step)
        t1 = time.perf_counter()
        self.selected = None
        self._render_new([step])
        self.timings.append(("step", step.index, t1 - t0, time.perf_counter() - t1))
        self._say_step(step)
        return step

    def rewind(self, k: int = 1) -> None:
        """Drop the last k tokens (the cache is cropped, nothing recomputed) and redraw."""
        n = len(self.session.steps)
        if n == 0:
            self.guard.say("Nothing to rewind: no step has been taken yet.", "info")
            return
        self.session.rewind(min(k, n))
        self.selected = None
        self._render_all()
        self.guard.say(f"Rewound to step {len(self.session.steps)}.", "ok")

    def reset(self) -> None:
        """A new session with the current controls (the old one is kept if building the new one fails)."""
        rs = controls.read_run_settings(self.run_parts)
        self._swap(self._build_session(rs, controls.read_sampling(self.sampling_parts)), rs)
        self.guard.say(f"New session. {messages.HINT}", "ok")

    def branch(self, step_index: int, token_id: int):
        """Choose token_id at step step_index (a counterfactual) and continue from there.

        Works on a fork, so a failure leaves the current session exactly as it was.
        """
        n = len(self.session.steps)
        if not 0 <= step_index < n:
            raise ValueError(f"step {step_index} does not exist (the session has {n} steps)")
        trial = self.session.fork()
        trial.rewind(n - step_index)
        self.wait_peaks()
        step = on_engine_thread(trial.choose, int(token_id))
        self.session = trial
        self.selected = None
        self._render_all()
        self.guard.say(
            f"Branched at step {step_index}: forced {plots.show_token(step.token_text)} (id {token_id}, "
            f"p final {step.prob_final:.3f}). Step or Play continues from here.",
            "ok",
        )
        return step

    def select(self, index: int | None) -> None:
        """Show the distribution of step `index` (None: follow the latest step)."""
        steps = self.session.steps
        if index is not None and not 0 <= index < len(steps):
            raise ValueError(
                f"step {index} does not exist (the session has {len(steps)} steps, 0 to {len(steps) - 1})"
            )
        self.selected = None if index is None or index == len(steps) - 1 else index
        self._show_distribution()
        for t in self.tab_list:
            t.step_selected(self.selected)

    def set_color_by(self, color_by: str) -> None:
        fresh = plots.strip_figure(color_by)  # only its coloraxis and title are used
        self.color_by = color_by
        self.strip.fig.update_layout(coloraxis=fresh.layout.coloraxis, title=fresh.layout.title)
        self._render_strip()

    def set_sampling(self, sampling: Sampling) -> None:
        """New sampling settings from the next step (validated first; on error nothing changes)."""
        with self.guard.lock:
            self.session.set_sampling(sampling)

    # --- play / pause ----------------------------------------------------------------------------------

    def play(self) -> bool:
        """Step on a background thread until Pause, a stop, or max tokens. False if it could not start."""
        return self.player.play()

    def pause(self) -> None:
        """Stop Play after the step in progress."""
        self.player.pause()

    def wait(self, timeout: float | None = None) -> None:
        """Block until Play (or a sweep) has finished (for scripts and tests)."""
        for thread in (self.player.thread, *(th for t in self.tab_list for th in t.threads())):
            if thread is not None:
                thread.join(timeout)

    def show_new_steps(self, steps) -> None:
        """Draw steps just taken (by Play, between two of its steps; the guard's lock held)."""
        self.selected = None
        self._render_new(steps)

    # --- rendering ---------------------------------------------------------------------------------------

    def _render_new(self, steps) -> None:
        """Append just-taken steps to every view (the per-step path: no O(n) work)."""
        # The text and the distribution first: the browser draws messages in order, and these are the
        # views a person reads; the strip chart and the tab's chart follow (one message each).
        self.strip_text.append(steps, self.color_by)
        self._count()
        self._show_distribution()
        self.strip.append(steps, {"xaxis.range": plots.strip_range(steps[-1].index)})
        for t in self.tab_list:
            t.steps_added(steps)
        self._show_ceilings()

    def _render_all(self) -> None:
        """Redraw every view from the session's steps (after rewind, branch, a new session)."""
        steps = self.session.steps
        self._render_strip()
        self._show_distribution()
        self._count()
        for t in self.tab_list:
            t.steps_reset(steps)
        self._show_ceilings()

    def _render_strip(self) -> None:
        steps = self.session.steps
        self.strip_text.reset(steps, self.color_by)
        self.strip.reset(steps, {"xaxis.range": plots.strip_range(steps[-1].index if steps else 0)})

    def shown_index(self) -> int | None:
        """The step the views show: the selected one, else the latest (None before any step)."""
        steps = self.session.steps
        return self.selected if self.selected is not None else (len(steps) - 1 if steps else None)

    def _show_distribution(self) -> None:
        steps = self.session.steps
        index = self.shown_index()
        self.dist.show(steps[index] if index is not None else None, self.run_settings.top_n)
        if index is not None and self.inspect.value != index:
            self._write_quietly(lambda: setattr(self.inspect, "value", index))

    def _count(self) -> None:
        steps = self.session.steps
        last = steps[-1] if steps else None
        extra = (
            f" · {last.phase} {last.latency_s * 1e3:.1f} ms · {len(self.session.tokens)} tokens"
            if last
            else ""
        )
        stop = f" · stopped: {self.session.stop_reason}" if self.session.done else ""
        self.step_count.value = f'<span class="ie-step-n">step {len(steps)}</span>{extra}{stop}'

    def _show_ceilings(self) -> None:
        hw = self.session.trace.hardware
        if self._ceilings_shown or hw is None:
            return
        chips = known_chips(self.session.lm.info.dtype)
        for t in self.tab_list:
            t.peaks_known(hw, chips)
        self._ceilings_shown = True

    def _say_step(self, step) -> None:
        """The message after a step: why the session stopped; or, when the message still shows an
        error, a wait or the "press Step or Play" hint, a line that stays true at later steps (it
        is left alone afterwards: one message fewer per step)."""
        if self.session.done:
            self.guard.say(f"Stopped: {stop_text(self.session)}.", "info")
            return
        shown = self.message.value
        if (
            self.guard.last_error is not None
            or "ie-message-busy" in shown
            or messages.HINT in shown
        ):
            self.guard.last_error = None
            self.guard.say(messages.STEPPING, "ok")

    def _show_noise_note(self) -> None:
        """A random-weight model's text is noise: the strip says so above the text."""
        noise = self.session.lm.info.random_weights
        self.noise_note.value = (
            f'<div style="font-size:12px;color:#8a5a00;padding:2px 6px">{messages.NOISE_NOTE}</div>'
            if noise
            else ""
        )

    # --- clicks ------------------------------------------------------------------------------------------

    def _on_strip_click(self, trace, points, state) -> None:
        if points.point_inds:
            index = int(trace.customdata[points.point_inds[0]])
            self.guard.call("Selecting a step", self.select, index, while_busy=True)

    def _on_bar_click(self, trace, points, state) -> None:
        if not points.point_inds or self.dist.step is None:
            return
        token = self.dist.token_at(points.point_inds[0])
        self.guard.call("Branching", self.branch, self.dist.step.index, token)
