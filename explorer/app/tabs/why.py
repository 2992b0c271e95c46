"""The "Why this time?" tab: the selected step's speed-of-light split, its profiler breakdown, and
the trust table with one-click calibration.

    split      the selected step (or the latest) as floors + overhead, MBU / MFU / regime (plain data
               on the Step, explorer.costs.split); redrawn when a step is taken or selected
    Profile    Session.profile_step(): one more pass of that step under torch.profiler, by part
    trust      every prediction beside its measurement (explorer.costs.trust)
    Calibrate  a small regime map of the current model on a background thread (Stop keeps the
               cells), one calibration fitted to part of it and scored on the rest; then used by
               every prediction (explorer.costs.calibrate.use) and saved with the trace
"""

from __future__ import annotations

import time

import ipywidgets as W

from explorer import plots, sweeps
from explorer.app.controls import button, stop_button, tagged
from explorer.app.runner import Runner
from explorer.app.tabs import Tab, register
from explorer.app.views import figure_widget
from explorer.costs import calibrate
from explorer.costs.trust import trust
from explorer.sweeps.regime_map import calibration_from

CALIBRATION_BATCHES = (1, 4, 16)
CALIBRATION_CONTEXTS = (32, 128, 256)  # capped at the model's positions
TRUST_EVERY = 16  # while shown, the trust table follows the steps this often


def calibration_contexts(max_positions: int | None) -> list[int]:
    """The calibration grid's contexts that fit the model (at least three, evenly spread)."""
    cap = max_positions or max(CALIBRATION_CONTEXTS)
    out = sorted({min(c, cap) for c in CALIBRATION_CONTEXTS})
    if len(out) < 3:
        out = sorted({max(2, cap // 8), max(3, cap // 2), cap})
    return out


CHARTS = ("why-split", "why-profile", "why-trust")


def build() -> tuple[W.Widget, dict]:
    """The tab's widget and its parts (name -> widget, CSS class ie-<name>); no callbacks."""
    parts: dict = {}
    for name, figure in zip(CHARTS, (plots.split_figure, plots.profile_figure, plots.trust_figure)):
        parts[name] = figure_widget(figure)
        parts[name].add_class(f"ie-{name}")
    parts["why-profile-run"] = button(
        "why-profile-run", "Profile this step", "search",
        tip="run the selected step once more (3 repeats) under torch.profiler", width=None,
    )  # fmt: skip
    parts["why-profile-text"] = tagged(W.HTML(), "why-profile-text")
    parts["why-calibrate"] = button(
        "why-calibrate", "Calibrate", "sliders", width=None,
        tip="measure a small batch x context grid of this model and fit bandwidth, FLOP/s and "
        "overhead to part of it",
    )  # fmt: skip
    parts["why-calibrate-stop"] = stop_button(
        "why-calibrate-stop", "stop the calibration grid after its current cell"
    )
    parts["why-calibrate-progress"] = tagged(
        W.IntProgress(value=0, min=0, max=1, layout=W.Layout(width="200px")),
        "why-calibrate-progress",
    )
    parts["why-calibration-text"] = tagged(
        W.HTML("No calibration yet: predictions are the plain roofline bound."),
        "why-calibration-text",
    )
    widget = W.VBox(
        [
            parts["why-split"],
            W.HBox([parts["why-profile-run"], parts["why-profile-text"]]),
            parts["why-profile"],
            W.HBox([parts[f"why-calibrate{s}"] for s in ("", "-stop", "-progress")]),
            parts["why-calibration-text"],
            parts["why-trust"],
        ]
    )
    widget.add_class("ie-why")
    parts["why"] = widget
    return widget, parts


@register(35)
class WhyTab(Tab):
    name, title = "why", "Why this time?"
    about = (
        "Why did this step take its time? The bar splits the measured latency into the cost "
        "model's floors at this machine's measured peaks (modelled) and the overhead that no floor "
        "explains (measured - bound). Select a step in the strip to see it."
    )

    def __init__(self, dash):
        super().__init__(dash)
        self.live = False
        self.profile: dict | None = None
        self.calibration = None
        self._since_trust = 0
        self.widget, self.parts = build()
        p = self.parts
        self.runner = Runner(
            self,
            "Calibration",
            controls=[p["why-profile-run"], p["why-calibrate"]],
            stop=p["why-calibrate-stop"],
            progress=p["why-calibrate-progress"],
            stopping="Stopping the calibration grid after its current cell…",
            unit="cells",
        )
        p["why-profile-run"].on_click(
            lambda _: dash.guard.call("Profiling the step", self.run_profile)
        )
        p["why-calibrate"].on_click(lambda _: self.start_calibration())

    # --- the Tab protocol ---

    def figures(self):
        return [self.parts[name] for name in CHARTS]

    def set_live(self, live: bool) -> None:
        self.live = live
        if live:
            self.refresh()

    def steps_added(self, steps) -> None:
        if not self.live:
            return
        self._since_trust += len(steps)
        if self.dash.selected is None:
            self.show_split()
        if self._since_trust >= TRUST_EVERY:
            self.show_trust()

    def steps_reset(self, steps) -> None:
        self.profile = None
        plots.redraw(self.parts["why-profile"], plots.profile_figure(None))
        self.parts["why-profile-text"].value = ""
        if self.live:
            self.refresh()

    def step_selected(self, index) -> None:
        if self.live:
            self.show_split()

    def session_changed(self) -> None:
        model = self.dash.session.lm.info.name
        mine = self.calibration is not None and model in self.calibration.models
        if not mine:  # nothing of another model's calibration shows (its bar neither)
            self.parts["why-calibrate-progress"].value = 0
            text = "No calibration for this model yet: predictions are the plain roofline bound."
            self.parts["why-calibration-text"].value = text

    # --- views ---

    def step(self):
        """The step the person is looking at: the selected one, or the latest (None before any)."""
        index = self.dash.shown_index()
        return None if index is None else self.dash.session.steps[index]

    def refresh(self) -> None:
        self.show_split()
        self.show_trust()

    def show_split(self) -> None:
        plots.redraw(self.parts["why-split"], plots.split_figure(self.step()))

    def show_trust(self) -> None:
        self._since_trust = 0
        plots.redraw(self.parts["why-trust"], plots.trust_figure(trust(self.dash.session.trace)))

    # --- profile ---

    def run_profile(self) -> None:
        """Profile the step in view (the pending prefill before any step)."""
        step = self.step()
        self.profile = self.dash.session.profile_step(None if step is None else step.index)
        p = self.profile
        plots.redraw(self.parts["why-profile"], plots.profile_figure(p))
        self.parts["why-profile-text"].value = (
            f"On this model, {100 * p['python_share']:.0f}% of step {p['step']} is framework/Python "
            f"time; the top three parts are {', '.join(p['top'])} (measured, {p['timing']}, median "
            f"of {p['repeats']}; unprofiled latency "
            + (f"{p['latency_s'] * 1e3:.3g} ms" if p["latency_s"] else "not measured yet")
            + ")."
            + (f" Noisy: {p['noisy_reason']}." if p.get("noisy") else "")
        )
        self.dash.guard.say(f"Profiled step {p['step']}.", "ok")

    # --- calibration ---

    def start_calibration(self) -> bool:
        """Measure the calibration grid on a background thread. False if it did not start."""
        lm = self.dash.session.lm
        kwargs = {
            "batches": CALIBRATION_BATCHES,
            "contexts": calibration_contexts(lm.info.max_positions),
            "repeats": 3,
        }
        return self.runner.start(
            f"Calibrating on {lm.info.name}: decode at batches {list(kwargs['batches'])} x contexts "
            f"{kwargs['contexts']}… (Stop ends it after the current cell)",
            self._calibrate,
            lm,
            kwargs,
        )

    def _calibrate(self, lm, kwargs) -> None:
        g, r = self.dash.guard, self.runner
        t0 = time.perf_counter()
        df = sweeps.run("regime-map", lm, progress=r.tick, bar=False, stop=r.stop_event, **kwargs)
        cal = calibration_from([df], refuse_busy=True)  # busy: the last good fit stays
        calibrate.use(cal)
        self.calibration = cal
        with g.lock:
            if self.dash.session.lm is lm:
                self.dash.session.trace.calibration = cal.to_dict()
            self.parts["why-calibration-text"].value = (
                f"Calibration in use for {lm.info.name} ({cal.device}, {cal.dtype}, "
                f"{cal.threads} threads; measured in {time.perf_counter() - t0:.0f} s): "
                f"{cal.summary()}"
            )
            self.show_trust()
        r.finished(
            f"Calibrated on {cal.n_train} steps; held-out median error "
            f"{cal.heldout_err_before_pct:.0f}% (roofline bound) -> "
            f"{cal.heldout_err_after_pct:.0f}% (calibrated) on {cal.n_heldout} steps."
        )
