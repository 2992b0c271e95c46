"""The dashboard: controls and live charts over one explorer.Session.

    from explorer.app import Dashboard
    Dashboard()                      # a notebook cell ending in this displays it (also the Voila app)

Thin views: every callback calls the core once (session.step(), fork/rewind/choose, a new
Session) and re-renders from the Steps it returned. Errors never break the app: callbacks run
through one Guard (explorer.app.guard) that shows a readable message in the `message` area;
new Sessions and Sampling settings are built and validated first and only swapped in on success.

Shared mode (a classroom server): Dashboard(shared=True, allowed_models=[...]) offers only the
allow-list and hides the free-text model box (explorer.app.models: the loaded models, the allow-list,
the memory check). Play runs on its own thread (explorer.app.play); the side panel is built from the
settings' declarations (explorer.app.controls.side_panel); each tab is a module of explorer.app.tabs.
"""

from __future__ import annotations

import collections
import time
from dataclasses import replace as dc_replace

import ipywidgets as W

from explorer import plots
from explorer.app import controls, messages
from explorer.app.export import trace_csv, trace_json
from explorer.app.guard import Guard, on_engine_thread
from explorer.app.messages import stop_text
from explorer.app.models import ModelCache
from explorer.app.peaks import PeakMeter, known_chips
from explorer.app.play import Player
from explorer.app.views import (
    Distribution,
    LiveChart,
    StripText,
    figure_widget,
    refit,
    resync,
)
from explorer.app.voila.liveness import Liveness
from explorer.engine.sampling import Sampling
from explorer.engine.session import prompt_input
from explorer.model.loader import LoadedModel, ModelNotFoundError

DEFAULT_PROMPT = "The return statement"  # in the bundled models' domain (Python docs)
FALLBACK_MODEL = "arch:gpt2"  # when the bundled models are missing and no model was named
# Opens on settings whose text reads as English on the bundled model (plain sampling at temperature
# 1 is hard to read); every control keeps its full range.
DEFAULT_SAMPLING = Sampling(temperature=0.7, top_p=0.9)


class Dashboard:
    """Controls + token strip + distribution + every registered tab (explorer.app.tabs, in order).

    dash.widget is the top-level container, dash.parts names every control, figure and message
    area (the CSS class of each is `ie-<name>`), dash.session is the current explorer.Session.
    """

    def __init__(
        self,
        model: str | None = None,
        prompt: str = DEFAULT_PROMPT,
        *,
        sampling: Sampling | None = None,
        use_cache: bool = True,
        batch_size: int = 1,
        top_n: int = 20,
        max_new_tokens: int | None = 200,
        shared: bool | None = None,
        allowed_models: list[str] | None = None,
        lm: LoadedModel | None = None,
        measure_peaks: bool = True,
        play_render_interval_s: float = 0.5,
        play_max_tokens_per_s: float | None = 30.0,
    ):
        self.models = ModelCache(shared, allowed_models)
        self.shared, self.allowed_models = self.models.shared, self.models.allowed
        self.measure_peaks = measure_peaks
        self.player = Player(self, play_max_tokens_per_s, play_render_interval_s)
        if lm is not None:
            self.models.add(lm)
        name = model or (lm.info.name if lm is not None else self.models.default())
        self.run_settings = controls.RunSettings(
            model=name,
            prompt=prompt,
            use_cache=use_cache,
            batch_size=batch_size,
            top_n=top_n,
            max_new_tokens=max_new_tokens,
        )
        sampling = sampling or DEFAULT_SAMPLING
        self.selected: int | None = None  # the step the distribution shows; None = the latest
        self.color_by = "prob"
        self.earlier: tuple[list, bool] | None = None  # (steps, use_cache) before a cache toggle
        self.timings: collections.deque = collections.deque(maxlen=5000)  # (kind, step, s, s)
        self._quiet = False  # True while the code itself writes control values
        self.peak_meter = PeakMeter(measure_peaks)
        self._ceilings_shown = False

        self._fallback_note = ""
        self.session = self._first_session(sampling, explicit=model is not None or lm is not None)
        self.guard: Guard  # set in _build_widgets
        self._build_widgets(sampling)
        self._warm_peaks()

    @property
    def _models(self) -> dict[str, LoadedModel]:
        """The loaded models by name (explorer.app.models.ModelCache.loaded)."""
        return self.models.loaded

    # --- construction ------------------------------------------------------------------------------

    def _first_session(self, sampling: Sampling, explicit: bool):
        """The first Session; with no model named and the bundled ones missing, an architecture-only
        shape instead (said in the message area) so that `Dashboard()` always opens."""
        try:
            return self._build_session(self.run_settings, sampling)  # raises: nothing to keep yet
        except ModelNotFoundError as err:
            if explicit or self.shared:
                raise
            missing = str(err).splitlines()[0]
            self.run_settings = dc_replace(self.run_settings, model=FALLBACK_MODEL)
            self._fallback_note = f"{missing}. Showing {FALLBACK_MODEL} instead. "
            return self._build_session(self.run_settings, sampling)

    def model_names(self) -> list[str]:
        """The models the model dropdowns offer."""
        return self.models.names(getattr(self, "run_settings", None) and self.run_settings.model)

    def load_model(self, name: str) -> LoadedModel:
        """A model by name, loaded once and kept (a draft for the Speculative tab, ...)."""
        self.models.check_offered(name)
        return self.models.load(name)

    def _build_widgets(self, sampling: Sampling) -> None:
        self.message = W.HTML(value="", layout=W.Layout(width="100%"))
        self.message.add_class("ie-message")
        self.liveness = Liveness()  # a banner if the kernel behind the page goes quiet (culled)
        self.guard = Guard(self.message, on_finish=self._refresh_controls)
        self.sampling_parts = controls.sampling_controls(sampling)
        self.run_parts = controls.session_controls(
            self.model_names(), self.run_settings, free_text=not self.shared
        )
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
        self._build_tabs()
        self._wire()
        self._layout()
        self._refresh_controls()
        self.guard.say(messages.ready_text(self.session.lm, self._fallback_note), "info")

    def _build_tabs(self) -> None:
        from explorer.app import tabs

        self.tab_list = []  # filled in order: a tab sees those before it (Export lists their charts)
        for cls in tabs.registered():
            self.tab_list.append(cls(self))
        self.latency, self.traffic, self.roofline = (
            self.tab(n).chart for n in ("latency", "traffic", "roofline")
        )
        self.sweeps, self.speculative = self.tab("sweeps"), self.tab("speculative")
        self.tabs = W.Tab(
            children=[_with_about(t) for t in self.tab_list],
            titles=[t.title for t in self.tab_list],
        )
        self.tabs.add_class("ie-tabs")
        self.tabs.observe(lambda ch: self._tab_shown(ch["new"]), names="selected_index")
        self._tab_shown(self.tabs.selected_index)

    def tab(self, name: str):
        """The tab registered under `name` (explorer.app.tabs)."""
        for t in self.tab_list:
            if t.name == name:
                return t
        raise KeyError(f"no tab named {name!r}; tabs: {', '.join(t.name for t in self.tab_list)}")

    def _tab_shown(self, index: int | None) -> None:
        """Only the visible tab's chart is sent data per step; a tab catches up when it is selected.
        An error message belonged to the tab left behind: it goes."""
        if self.guard.last_error is not None and self.guard.busy is None:
            self.guard.last_error = None
            self.guard.say("", "info")
        for i, t in enumerate(self.tab_list):
            t.set_live(index == i)
        if index is not None and 0 <= index < len(self.tab_list):
            for fig in self.tab_list[index].shown_figures():
                refit(fig)

    def _layout(self) -> None:
        buttons = self.button_parts
        side = controls.side_panel(self.run_parts, self.sampling_parts)
        self.strip_box = W.VBox(
            [self.noise_note, self.strip_text.widget, self.strip.fig],
            layout=W.Layout(width="100%"),
        )
        self.strip_box.add_class("ie-strip")
        bar = W.HBox(
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
        main = W.VBox(
            [bar, self.strip_box, self.dist.widget], layout=W.Layout(flex="1 1 auto", min_width="0")
        )
        self.widget = W.VBox(
            [
                W.HTML(controls.PAGE_CSS),
                self.liveness,
                self.message,
                W.HBox([side, main], layout=W.Layout(width="100%")),
                self.tabs,
            ],
            layout=W.Layout(width="100%"),
        )
        self.widget.add_class("ie-dashboard")
        self.parts: dict[str, W.Widget] = {
            **self.run_parts,
            **self.sampling_parts,
            **self.button_parts,
            "message": self.message,
            "liveness": self.liveness,
            "strip": self.strip_box,
            "strip-text": self.strip_text.widget,
            "noise-note": self.noise_note,
            "strip-chart": self.strip.fig,
            "step-count": self.step_count,
            "color-by": self.color_toggle,
            "inspect": self.inspect,
            "dist": self.dist.fig,
            "dist-title": self.dist.title,
            "tabs": self.tabs,
        }
        for t in self.tab_list:
            self.parts.update(t.parts)

    def _wire(self) -> None:
        g, buttons = self.guard, self.button_parts
        buttons["step"].on_click(g.action("Step", lambda _: self.step()))
        buttons["play"].on_click(lambda _: self.play())
        buttons["pause"].on_click(lambda _: self.pause())
        buttons["rewind"].on_click(g.action("Rewind", lambda _: self.rewind()))
        buttons["reset"].on_click(g.action("Reset", lambda _: self.reset()))
        for widget in self.sampling_parts.values():
            widget.observe(self._on_sampling, names="value")
        for widget in self.run_parts.values():
            widget.observe(self._on_run_setting, names="value")
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

    # --- display -----------------------------------------------------------------------------------

    def _resync(self) -> None:
        """Before display: copy every figure's current data into its synced traits."""
        self.strip.flush()
        for t in self.tab_list:
            t.flush()
        for fig in [self.strip.fig, self.dist.fig] + [
            f for t in self.tab_list for f in t.figures()
        ]:
            resync(fig)

    def _repr_mimebundle_(self, include=None, exclude=None, **kwargs):
        self._resync()
        return self.widget._repr_mimebundle_(include=include, exclude=exclude, **kwargs)

    def _ipython_display_(self):
        from IPython.display import display

        self._resync()
        display(self.widget)

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

    # --- settings changes --------------------------------------------------------------------------------

    def _on_sampling(self, change) -> None:
        if self._quiet:
            return
        self.guard.call("Changing the sampling settings", self._apply_sampling, while_busy=True)

    def _apply_sampling(self) -> None:
        try:
            sampling = controls.read_sampling(self.sampling_parts)
            self.session.set_sampling(sampling)
        except Exception:
            self._write_quietly(
                lambda: controls.write_sampling(self.sampling_parts, self.session.sampling)
            )
            raise
        self.guard.say(
            "Sampling settings apply from the next step: " + messages.sampling_text(sampling),
            "ok",
        )

    def _on_run_setting(self, change) -> None:
        if self._quiet:
            return
        custom = self.run_parts.get("model-custom")
        if change["owner"] is custom and custom.value.strip():
            # a hub id typed in 'hub id / path' is the model asked for: the dropdown says "other"
            self._write_quietly(
                lambda: setattr(self.run_parts["model"], "value", controls.CUSTOM_MODEL)
            )
        if (
            self.run_parts["model"].value == controls.CUSTOM_MODEL
            and not self.run_parts.get("model-custom").value.strip()
        ):
            self.guard.say(
                "Type a hub id (e.g. Qwen/Qwen2.5-0.5B) or a local folder in 'hub id / path'.",
                "info",
            )
            return
        if self.guard.busy:
            self._write_quietly(
                lambda: controls.write_run_settings(self.run_parts, self.run_settings)
            )
        self.guard.call("Changing the model or session settings", self._apply_run_settings)

    def _apply_run_settings(self) -> None:
        try:
            rs = controls.read_run_settings(self.run_parts)
            if rs.model not in self.models.loaded:
                rough = self.models.rough_load_s(rs.model)
                with messages.loading(self.guard, rs.model, rough, self._refresh_controls):
                    session = self._build_session(rs, self.session.sampling)
            else:
                if rs.compile:
                    self.guard.say(
                        "Compiling the decode step (torch.compile, seconds to a minute)…", "busy"
                    )
                session = self._build_session(rs, self.session.sampling)
        except Exception:
            self._write_quietly(
                lambda: controls.write_run_settings(self.run_parts, self.run_settings)
            )
            raise
        old, old_rs = self.session, self.run_settings
        if rs.use_cache != old_rs.use_cache and old.steps:
            self.earlier = (list(old.steps), old_rs.use_cache)
        self._swap(session, rs)
        note = f" {messages.NOISE_NOTE}" if session.lm.info.random_weights else ""
        changed = messages.what_changed(old_rs, rs) + messages.compiled_note(session)
        self.guard.say(f"New session ({changed}). {messages.HINT}{note}", "ok")

    def _write_quietly(self, fn) -> None:
        self._quiet = True
        try:
            fn()
        finally:
            self._quiet = False

    # --- sessions and models -----------------------------------------------------------------------------

    def _build_session(self, rs: controls.RunSettings, sampling: Sampling):
        """A new Session for `rs` (touches nothing of the current one; raises on any problem)."""
        from explorer.engine import Session

        lm = self.load_model(rs.model)
        return Session(
            lm,
            prompt_input(lm, rs.prompt),
            sampling,
            use_cache=rs.use_cache,
            top_n=rs.top_n,
            max_new_tokens=rs.max_new_tokens,
            batch_size=rs.batch_size,
            roofline=self.measure_peaks,
            stop_at_eos=rs.stop_at_eos,
            cache=rs.cache_type,
            compile=rs.compile,
            weights=None if rs.weights == "as loaded" else rs.weights,
        )

    def _swap(self, session, rs: controls.RunSettings) -> None:
        """Make `session` current and redraw everything from it."""
        self.session, self.run_settings = session, rs
        self.selected = None
        self._ceilings_shown = False
        for t in self.tab_list:
            t.session_changed()
        self.strip_text.set_prompt(self.run_settings.prompt)
        self._show_noise_note()
        self._render_all()
        self._warm_peaks()

    # --- measured peaks ------------------------------------------------------------------------------

    def _warm_peaks(self) -> None:
        self.peak_meter.warm(self.session.device, self.session.lm.model.dtype)

    def wait_peaks(self) -> None:
        """Wait for the peaks measured in the background (a step's roofline needs them)."""
        self.peak_meter.wait()

    def peaks(self):
        """This machine's measured peaks for the current model's device and dtype (None if not measured)."""
        return self.peak_meter.measure(self.session.device, self.session.lm.model.dtype)

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

    # --- controls state ----------------------------------------------------------------------------------

    def _refresh_controls(self) -> None:
        busy = self.guard.busy is not None
        playing = busy and self.guard.busy == "Play"
        stopped = self.session.done
        for name in ("step", "rewind", "reset"):
            self.button_parts[name].disabled = busy
        self.button_parts["step"].disabled = busy or stopped
        self.button_parts["play"].disabled = busy or stopped
        self.button_parts["pause"].disabled = not playing
        for widget in self.run_parts.values():
            widget.disabled = busy
        for t in self.tab_list:
            t.set_busy(busy)

    # --- export ------------------------------------------------------------------------------------------

    def export_figures(self, current: bool = False) -> dict:
        """Every chart offered for export, by name: the shell's own, then each tab's
        (Tab.export_figures). current=True brings them up to date first (for a download)."""
        if current:
            self.strip.flush()
            for t in self.tab_list:
                t.flush()
        dist = self.dist.figure() if current else self.dist.fig
        out = {"token strip": self.strip.fig, "distribution": dist}
        for t in self.tab_list:
            out.update(t.export_figures())
        return out

    def prepare_export(self) -> str:
        """Build the download link for the Export tab's choice; returns its HTML."""
        return self.tab("export").prepare()

    def export(self, what: str = "json") -> str:
        """The current trace as 'json' or 'csv' text (for scripts)."""
        if what not in ("json", "csv"):
            raise ValueError(f"export what must be 'json' or 'csv', got {what!r}")
        return trace_json(self.session.trace) if what == "json" else trace_csv(self.session.trace)


# --- helpers -------------------------------------------------------------------------------------------


def _with_about(tab) -> W.Widget:
    """A tab's page: its one line on what it shows and how to read it, then its widget."""
    about = W.HTML(f'<div style="font-size:13px;color:#333;padding:2px 0 6px 0">{tab.about}</div>')
    about.add_class("ie-tab-about")
    return W.VBox([about, tab.widget], layout=W.Layout(width="100%", overflow="hidden"))
