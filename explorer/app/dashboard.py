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
The stepping panel (Step/Play/Rewind, the token strip, the distribution) is its own room,
explorer.app.stepping; this module is the shell around it: settings, sessions, tabs, export.
"""

from __future__ import annotations

from dataclasses import replace as dc_replace

import ipywidgets as W

from explorer.app import controls, messages
from explorer.app.export import trace_csv, trace_json
from explorer.app.guard import Guard
from explorer.app.models import ModelCache
from explorer.app.peaks import PeakMeter
from explorer.app.play import Player
from explorer.app.stepping import SteppingPanel
from explorer.app.views import (
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


class Dashboard(SteppingPanel):
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
        self.measure_peaks = measure_peaks
        self._init_stepping(Player(self, play_max_tokens_per_s, play_render_interval_s))
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
        self.earlier: tuple[list, bool] | None = None  # (steps, use_cache) before a cache toggle
        self._quiet = False  # True while the code itself writes control values
        self.peak_meter = PeakMeter(measure_peaks)

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
            if explicit or self.models.shared:
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
            self.model_names(), self.run_settings, free_text=not self.models.shared
        )
        self._build_stepping()
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
        side = controls.side_panel(self.run_parts, self.sampling_parts)
        self.widget = W.VBox(
            [
                W.HTML(controls.PAGE_CSS),
                self.liveness,
                self.message,
                W.HBox([side, self._stepping_panel()], layout=W.Layout(width="100%")),
                self.tabs,
            ],
            layout=W.Layout(width="100%"),
        )
        self.widget.add_class("ie-dashboard")
        self.parts: dict[str, W.Widget] = {
            **self.run_parts,
            **self.sampling_parts,
            **self.stepping_parts(),
            "message": self.message,
            "liveness": self.liveness,
            "tabs": self.tabs,
        }
        for t in self.tab_list:
            self.parts.update(t.parts)

    def _wire(self) -> None:
        for widget in self.sampling_parts.values():
            widget.observe(self._on_sampling, names="value")
        for widget in self.run_parts.values():
            widget.observe(self._on_run_setting, names="value")
        self._wire_stepping()

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

    # --- controls state ----------------------------------------------------------------------------------

    def _refresh_controls(self) -> None:
        busy = self.guard.busy is not None
        self._refresh_stepping()
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
