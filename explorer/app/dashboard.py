"""The dashboard: controls and live charts over one explorer.Session.

    from explorer.app import Dashboard
    Dashboard()                      # a notebook cell ending in this displays it (also the Voila app)

Thin views: every callback calls the core once (session.step(), fork/rewind/choose, a new
Session) and re-renders from the Steps it returned. Errors never break the app: callbacks run
through one Guard (explorer.app.guard) that shows a readable message in the `message` area;
new Sessions and Sampling settings are built and validated first and only swapped in on success.

Shared mode (a classroom server): Dashboard(shared=True, allowed_models=[...]) offers only the
allow-list and hides the free-text model box. When those arguments are not given they come from
the environment: EXPLORER_SHARED=1 and EXPLORER_MODELS_CONFIG=<path to JSON> holding
{"models": ["bundled:target", ...]} or a bare list (the format `explorer app --shared` writes).
"""

from __future__ import annotations

import collections
import os
import threading
import time
from dataclasses import replace as dc_replace

import ipywidgets as W

from explorer import plots
from explorer.app import controls
from explorer.app.export import trace_csv, trace_json
from explorer.app.guard import Guard, on_engine_thread
from explorer.app.views import Distribution, LiveChart, StripText, figure_widget, refit, resync
from explorer.app.voila.liveness import Liveness
from explorer.engine.sampling import Sampling
from explorer.engine.session import prompt_input
from explorer.model.device import available_bytes, dtype_name, resolve_device, resolve_dtype
from explorer.model.loader import LoadedModel, ModelNotFoundError, available_models, load

DEFAULT_PROMPT = "The return statement"  # in the bundled models' domain (Python docs)
FALLBACK_MODEL = "arch:gpt2"  # when the bundled models are missing and no model was named
# Opens on settings whose text reads as English on the bundled model (plain sampling at temperature
# 1 is hard to read); every control keeps its full range.
DEFAULT_SAMPLING = Sampling(temperature=0.7, top_p=0.9)
MEMORY_HEADROOM = 0.8  # refuse to load a model whose weights exceed this share of free memory


class Dashboard:
    """Controls + token strip + distribution + latency / traffic / roofline / sweeps / speculative tabs.

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
        self.shared, self.allowed_models = _shared_config(shared, allowed_models)
        self.measure_peaks = measure_peaks
        self.play_render_interval_s = play_render_interval_s
        # Play is paced: a page cannot draw faster than about this on a small machine, and an engine
        # running flat out starves the browser (measured on 2 cores: 107 tokens/s computed, 28 shown,
        # 1.5 s behind, Pause lost). Each step's latency is still timed alone; None = flat out.
        self.play_max_tokens_per_s = play_max_tokens_per_s
        self._models: dict[str, LoadedModel] = {}
        if lm is not None:
            self._models[lm.info.name] = lm
        name = model or (lm.info.name if lm is not None else self._default_model())
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
        self.earlier: tuple[list, bool] | None = (
            None  # (steps, use_cache) of the run before a cache toggle
        )
        self.timings: collections.deque = collections.deque(
            maxlen=5000
        )  # (kind, step index, seconds)
        self._quiet = False  # True while the code itself writes control values
        self._pause = threading.Event()
        self._thread: threading.Thread | None = None
        self._peaks_thread: threading.Thread | None = None
        self._ceilings_shown = False

        self._fallback_note = ""
        self.session = self._first_session(sampling, explicit=model is not None or lm is not None)
        self.guard: Guard  # set in _build_widgets
        self._build_widgets(sampling)
        self._warm_peaks()

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

    def _default_model(self) -> str:
        if self.allowed_models:
            return self.allowed_models[0]
        return "bundled:target"

    def _model_names(self) -> list[str]:
        names = list(self.allowed_models) if self.allowed_models else available_models()
        current = self.run_settings.model if hasattr(self, "run_settings") else None
        if current and current not in names and not self.shared and current in self._models:
            names.append(current)
        return names

    def _build_widgets(self, sampling: Sampling) -> None:
        self.message = W.HTML(value="", layout=W.Layout(width="100%"))
        self.message.add_class("ie-message")
        self.liveness = (
            Liveness()
        )  # a banner if the kernel behind the page goes quiet (killed, culled)
        self.guard = Guard(self.message, on_finish=self._refresh_controls)
        self.sampling_parts = controls.sampling_controls(sampling)
        self.run_parts = controls.session_controls(
            self._model_names(), self.run_settings, free_text=not self.shared
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
        self.strip_text.set_prompt(self._prompt_shown())
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
        self.guard.say(self._ready_text(), "info")

    def _build_tabs(self) -> None:
        from explorer.app import tabs

        self.tab_list = [cls(self) for cls in tabs.registered()]
        self.latency, self.traffic, self.roofline = (
            self.tab(n).chart for n in ("latency", "traffic", "roofline")
        )
        self.sweeps, self.speculative = self.tab("sweeps"), self.tab("speculative")
        self.tabs = W.Tab(
            children=[t.widget for t in self.tab_list], titles=[t.title for t in self.tab_list]
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
        """Only the visible tab's chart is sent data per step; a tab catches up when it is selected."""
        for i, t in enumerate(self.tab_list):
            t.set_live(index == i)
        if index is not None and 0 <= index < len(self.tab_list):
            for fig in self.tab_list[index].shown_figures():
                refit(fig)

    def _layout(self) -> None:
        sampling, run, buttons = self.sampling_parts, self.run_parts, self.button_parts
        model_box = [run["model"]] + ([run["model-custom"]] if "model-custom" in run else [])
        side = W.VBox(
            [
                W.HTML("<b>Model and prompt</b>"),
                *model_box,
                run["prompt"],
                run["cache"],
                run["batch"],
                run["top-n"],
                run["max-tokens"],
                run["stop-eos"],
                W.HTML("<b>Engine</b> (the optimisation ladder)"),
                run["cache-type"],
                run["compile"],
                run["weights"],
                W.HTML("<b>Sampling</b> (applies from the next step)"),
                sampling["temperature"],
                sampling["top-k"],
                sampling["top-p"],
                sampling["min-p"],
                sampling["repetition-penalty"],
                sampling["seed"],
                sampling["greedy"],
            ],
            layout=W.Layout(width="270px", min_width="270px"),
        )
        self.strip_box = W.VBox(
            [self.strip_text.widget, self.strip.fig], layout=W.Layout(width="100%")
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
                f"The session has stopped ({self.session.stop_reason}). Rewind, Reset, or raise "
                "max tokens to go on.",
                "info",
            )
            return None
        self._wait_peaks()
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
        self.guard.say("New session: press Step or Play.", "ok")

    def branch(self, step_index: int, token_id: int):
        """Choose token_id at step step_index (a counterfactual) and continue from there.

        Works on a fork, so a failure leaves the current session exactly as it was.
        """
        n = len(self.session.steps)
        if not 0 <= step_index < n:
            raise ValueError(f"step {step_index} does not exist (the session has {n} steps)")
        trial = self.session.fork()
        trial.rewind(n - step_index)
        self._wait_peaks()
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
        self._render_strip(reset=True)

    def set_sampling(self, sampling: Sampling) -> None:
        """New sampling settings from the next step (validated first; on error nothing changes)."""
        with self.guard.lock:
            self.session.set_sampling(sampling)

    # --- play / pause ----------------------------------------------------------------------------------

    def play(self) -> bool:
        """Step on a background thread until Pause, a stop, or max tokens. False if it could not start."""
        if self.session.done:
            self.guard.say(
                f"The session has stopped ({self.session.stop_reason}); Rewind or Reset first.",
                "info",
            )
            return False
        if not self.guard.start("Play"):
            return False
        self._pause.clear()
        self._thread = threading.Thread(target=self._play_loop, name="explorer-play", daemon=True)
        self._thread.start()
        return True

    def pause(self) -> None:
        """Stop Play after the step in progress."""
        self._pause.set()

    def wait(self, timeout: float | None = None) -> None:
        """Block until Play (or a sweep) has finished (for scripts and tests)."""
        for thread in (self._thread, *(th for t in self.tab_list for th in t.threads())):
            if thread is not None:
                thread.join(timeout)

    def _play_loop(self) -> None:
        pending, count = [], 0
        try:
            self._wait_peaks()
            start = due = last_render = time.perf_counter()
            while not self._pause.is_set():
                with self.guard.lock:
                    if self.session.done:
                        break
                    t0 = time.perf_counter()
                    step = self.session.step()
                    pending.append(step)
                    count += 1
                    now = time.perf_counter()
                    self.timings.append(("play", step.index, now - t0, 0.0))
                    if now - last_render >= self.play_render_interval_s or self.session.done:
                        self.selected = None
                        self._render_new(pending)
                        pending, last_render = [], time.perf_counter()
                self.guard.yield_to_waiting()  # a click waiting for the lock gets it before the next step
                due = self._pace(due)
            with self.guard.lock:
                if pending:
                    self.selected = None
                    self._render_new(pending)
            rate = count / max(time.perf_counter() - start, 1e-9)
            why = f"stopped: {self.session.stop_reason}" if self.session.done else "paused"
            pace = (
                f", paced at up to {self.play_max_tokens_per_s:g}/s"
                if self.play_max_tokens_per_s
                else ""
            )
            self.guard.say(
                f"Play {why} after {count} tokens ({rate:.1f} tokens/s, charts included{pace}).",
                "ok",
            )
        except Exception as err:  # noqa: BLE001 - shown, and the session keeps every completed step
            with self.guard.lock:
                if pending:
                    self._render_new(pending)
            self.guard.fail(err, "Play")
        finally:
            self.guard.finish()

    def _pace(self, due: float) -> float:
        """Wait (Pause interrupts) until the next step is due at the Play pace; returns the time the
        one after it is due. A slow step is not made up for by a burst (no debt carried over)."""
        if not self.play_max_tokens_per_s:
            return due
        due = max(due + 1.0 / self.play_max_tokens_per_s, time.perf_counter())
        wait = due - time.perf_counter()
        if wait > 0:
            self._pause.wait(wait)
        return due

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
            "Sampling settings apply from the next step: " + _sampling_text(sampling), "ok"
        )

    def _on_run_setting(self, change) -> None:
        if self._quiet:
            return
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
            if rs.model not in self._models:
                self.guard.say(f"Loading {rs.model}…", "busy")
            elif rs.compile:
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
        self.guard.say(
            f"New session ({_what_changed(old_rs, rs)}){_compiled_note(session)}: press Step or Play.",
            "ok",
        )

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

        if self.shared and self.allowed_models and rs.model not in self.allowed_models:
            raise ValueError(
                f"{rs.model!r} is not offered on this server; choose one of {', '.join(self.allowed_models)}"
            )
        lm = self._load(rs.model)
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

    def _load(self, name: str) -> LoadedModel:
        if name in self._models:
            return self._models[name]
        _check_fits(name)
        lm = _load_quietly(name)
        keep = {
            k: v for k, v in self._models.items() if k.startswith("bundled:")
        }  # drop big models we left
        self._models = {**keep, name: lm}
        return lm

    def _swap(self, session, rs: controls.RunSettings) -> None:
        """Make `session` current and redraw everything from it."""
        self.session, self.run_settings = session, rs
        self.selected = None
        self._ceilings_shown = False
        for t in self.tab_list:
            t.session_changed()
        self.strip_text.set_prompt(self._prompt_shown())
        self._render_all()
        self._warm_peaks()

    def _prompt_shown(self) -> str:
        """The prompt as typed (for a model without a tokenizer the Trace holds it as <id> texts)."""
        return self.run_settings.prompt

    # --- measured peaks (once per process, off the first click's path) ------------------------------------

    def _warm_peaks(self) -> None:
        if not self.measure_peaks:
            return
        from explorer.costs import hardware

        device, dtype = self.session.device, self.session.lm.model.dtype
        self._peaks_thread = threading.Thread(
            target=_quietly,
            args=(hardware.measure, device, dtype),
            name="explorer-peaks",
            daemon=True,
        )
        self._peaks_thread.start()

    def _wait_peaks(self) -> None:
        thread = self._peaks_thread
        if thread is not None and thread.is_alive():
            thread.join()

    def peaks(self):
        """This machine's measured peaks for the current model's device and dtype (None if not measured)."""
        if not self.measure_peaks:
            return None
        from explorer.costs import hardware

        self._wait_peaks()
        return hardware.measure(self.session.device, dtype=self.session.lm.model.dtype)

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
        self._render_strip(reset=True)
        self._show_distribution()
        self._count()
        for t in self.tab_list:
            t.steps_reset(steps)
        self._show_ceilings()

    def _render_strip(self, reset: bool = False) -> None:
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
        from explorer.costs import hardware

        dtype = self.session.lm.info.dtype
        chips = {}
        for name in hardware.KNOWN_CHIPS:
            try:
                chips[name] = hardware.chip_peaks(name, dtype)
            except ValueError:  # the chip has no published figure for this dtype
                continue
        for t in self.tab_list:
            t.peaks_known(hw, chips)
        self._ceilings_shown = True

    def _say_step(self, step) -> None:
        if self.session.done:
            self.guard.say(f"Stopped: {self.session.stop_reason}.", "info")
        elif self.guard.last_error is not None or "ie-message-busy" in self.message.value:
            self.guard.last_error = None
            self.guard.say(
                f"Step {step.index}: {plots.show_token(step.token_text)} ({step.latency_s * 1e3:.1f} ms).",
                "ok",
            )

    def _ready_text(self) -> str:
        info = self.session.lm.info
        note = (
            " (random weights: the text is meaningless, the costs are real)"
            if info.random_weights
            else ""
        )
        tok = (
            ""
            if self.session.lm.tokenizer is not None
            else " It has no tokenizer: the prompt is fed as its UTF-8 bytes (or type token ids: 1 2 3) and tokens show as <id>."
        )
        return (
            f"{self._fallback_note}{info.name}: {info.parameters / 1e6:.1f}M parameters, {info.layers} layers, on {info.device} "
            f"{info.dtype}{note}.{tok} Press Step or Play."
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

    def prepare_export(self) -> str:
        """Build the download link for the Export tab's choice; returns its HTML."""
        return self.tab("export").prepare()

    def export(self, what: str = "json") -> str:
        """The current trace as 'json' or 'csv' text (for scripts)."""
        if what not in ("json", "csv"):
            raise ValueError(f"export what must be 'json' or 'csv', got {what!r}")
        return trace_json(self.session.trace) if what == "json" else trace_csv(self.session.trace)


# --- helpers -------------------------------------------------------------------------------------------


def _quietly(fn, *args) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - the step that needs the peaks measures again and reports
        pass


def _shared_config(shared: bool | None, allowed: list[str] | None) -> tuple[bool, list[str]]:
    """Shared mode and allow-list from the arguments, else EXPLORER_SHARED / EXPLORER_MODELS_CONFIG."""
    if shared is None:
        shared = os.environ.get("EXPLORER_SHARED", "").strip().lower() in ("1", "true", "yes", "on")
    if allowed is None and os.environ.get("EXPLORER_MODELS_CONFIG"):
        from explorer.app.voila.config import read_models_config

        allowed = read_models_config(os.environ["EXPLORER_MODELS_CONFIG"])
    if allowed is not None:
        if (
            not isinstance(allowed, (list, tuple))
            or not allowed
            or not all(isinstance(m, str) for m in allowed)
        ):
            raise ValueError(
                f"allowed_models must be a non-empty list of model names, got {allowed!r}"
            )
        allowed = [m.strip() for m in allowed]
    if shared and not allowed:
        allowed = ["bundled:target", "bundled:draft"]
    return bool(shared), list(allowed or [])


def _load_quietly(name: str) -> LoadedModel:
    """load(name) without transformers' 'Loading weights' progress bar (it would print above the app)."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        return load(name)
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _check_fits(name: str) -> None:
    """Refuse (MemoryError with a clear message) an architecture-only shape that would not fit in memory."""
    if not name.startswith("arch:"):
        return
    from explorer.model.loader import arch_info

    dev = resolve_device("auto")
    dtype = dtype_name(resolve_dtype("auto", dev))
    info = arch_info(name, dtype)  # built on the meta device: no memory allocated
    free = available_bytes(dev)
    if free is not None and info.weight_bytes > MEMORY_HEADROOM * free:
        raise MemoryError(
            f"{name} needs {info.weight_bytes / 1e9:.1f} GB for its {dtype} weights but only "
            f"{free / 1e9:.1f} GB is free on {dev}: not loaded (out of memory). The current model "
            "is still loaded; choose a smaller one."
        )


def _sampling_text(s: Sampling) -> str:
    d = s.to_dict()
    default = Sampling().to_dict()
    changed = [f"{k}={v}" for k, v in d.items() if v != default[k]]
    return ", ".join(changed) if changed else "plain sampling at temperature 1"


def _compiled_note(session) -> str:
    c = session.trace.settings.get("compile")
    if not c:
        return ""
    if not c["active"]:
        return f"; torch.compile failed, running eager ({c['reason']})"
    return f"; compiled in {c['compile_s']:.1f} s, kept out of every step's latency"


def _what_changed(old: controls.RunSettings, new: controls.RunSettings) -> str:
    names = {
        "model": "model",
        "prompt": "prompt",
        "use_cache": "KV cache",
        "batch_size": "batch size",
        "top_n": "top-n",
        "max_new_tokens": "max tokens",
        "stop_at_eos": "stop at end-of-text",
        "cache_type": "cache type",
        "compile": "compile",
        "weights": "weights",
    }
    changed = [label for key, label in names.items() if getattr(old, key) != getattr(new, key)]
    return ", ".join(changed) + " changed" if changed else "same settings"
