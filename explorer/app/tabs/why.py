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

import threading
import time

import ipywidgets as W

from explorer import plots, sweeps
from explorer.app.controls import button, stop_button, tagged
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
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._since_trust = 0
        self.charts = {
            "why-split": figure_widget(plots.split_figure),
            "why-profile": figure_widget(plots.profile_figure),
            "why-trust": figure_widget(plots.trust_figure),
        }
        for name, fig in self.charts.items():
            fig.add_class(f"ie-{name}")
        self.profile_button = button(
            "why-profile-run", "Profile this step", "search",
            tip="run the selected step once more (3 repeats) under torch.profiler", width=None,
        )  # fmt: skip
        self.profile_button.on_click(
            lambda _: dash.guard.call("Profiling the step", self.run_profile)
        )
        self.profile_text = tagged(W.HTML(), "why-profile-text")
        self._build_calibration()
        self.parts = {
            **self.charts,
            "why-profile-run": self.profile_button,
            "why-profile-text": self.profile_text,
            "why-calibrate": self.calibrate_button,
            "why-calibrate-stop": self.stop_button,
            "why-calibrate-progress": self.progress,
            "why-calibration-text": self.calibration_text,
        }
        self.widget = W.VBox(
            [
                self.charts["why-split"],
                W.HBox([self.profile_button, self.profile_text]),
                self.charts["why-profile"],
                W.HBox([self.calibrate_button, self.stop_button, self.progress]),
                self.calibration_text,
                self.charts["why-trust"],
            ]
        )
        self.widget.add_class("ie-why")
        self.parts["why"] = self.widget

    def _build_calibration(self) -> None:
        """The calibration row: Calibrate, its Stop, its progress, and what the fit says."""
        self.calibrate_button = button(
            "why-calibrate", "Calibrate", "sliders", width=None,
            tip="measure a small batch x context grid of this model and fit bandwidth, FLOP/s and "
            "overhead to part of it",
        )  # fmt: skip
        self.calibrate_button.on_click(lambda _: self.start_calibration())
        self.stop_button = stop_button(
            "why-calibrate-stop", "stop the calibration grid after its current cell", self._stop.set
        )
        self.progress = tagged(
            W.IntProgress(value=0, min=0, max=1, layout=W.Layout(width="200px")),
            "why-calibrate-progress",
        )
        self.calibration_text = tagged(
            W.HTML("No calibration yet: predictions are the plain roofline bound."),
            "why-calibration-text",
        )

    # --- the Tab protocol ---

    def figures(self):
        return list(self.charts.values())

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
        plots.redraw(self.charts["why-profile"], plots.profile_figure(None))
        self.profile_text.value = ""
        if self.live:
            self.refresh()

    def step_selected(self, index) -> None:
        if self.live:
            self.show_split()

    def session_changed(self) -> None:
        model = self.dash.session.lm.info.name
        mine = self.calibration is not None and model in self.calibration.models
        if not mine:  # nothing of another model's calibration shows (its bar neither)
            self.progress.value = 0
            self.calibration_text.value = (
                "No calibration for this model yet: predictions are the plain roofline bound."
            )

    def threads(self):
        return [self._thread]

    def set_busy(self, busy: bool) -> None:
        self.profile_button.disabled = busy
        self.calibrate_button.disabled = busy
        self.stop_button.disabled = not busy or self._thread is None

    # --- views ---

    def step(self):
        """The step the person is looking at: the selected one, or the latest (None before any)."""
        index = self.dash.shown_index()
        return None if index is None else self.dash.session.steps[index]

    def refresh(self) -> None:
        self.show_split()
        self.show_trust()

    def show_split(self) -> None:
        plots.redraw(self.charts["why-split"], plots.split_figure(self.step()))

    def show_trust(self) -> None:
        self._since_trust = 0
        plots.redraw(self.charts["why-trust"], plots.trust_figure(trust(self.dash.session.trace)))

    # --- profile ---

    def run_profile(self) -> None:
        """Profile the step in view (the pending prefill before any step)."""
        step = self.step()
        self.profile = self.dash.session.profile_step(None if step is None else step.index)
        p = self.profile
        plots.redraw(self.charts["why-profile"], plots.profile_figure(p))
        self.profile_text.value = (
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
        g = self.dash.guard
        if not g.start("Calibration"):
            return False
        lm = self.dash.session.lm
        kwargs = {
            "batches": CALIBRATION_BATCHES,
            "contexts": calibration_contexts(lm.info.max_positions),
            "repeats": 3,
        }
        self._stop.clear()
        self.progress.value = 0
        self.in_background(
            f"Calibrating on {lm.info.name}: decode at batches {list(kwargs['batches'])} x contexts "
            f"{kwargs['contexts']}… (Stop ends it after the current cell)",
            self._calibrate,
            lm,
            kwargs,
            name="explorer-calibrate",
        )
        return True

    def _calibrate(self, lm, kwargs) -> None:
        g = self.dash.guard

        def tick(done: int, total: int) -> None:
            self.progress.max, self.progress.value = max(total, 1), done

        t0 = time.perf_counter()
        try:
            df = sweeps.run("regime-map", lm, progress=tick, bar=False, stop=self._stop, **kwargs)
            cal = calibration_from([df], refuse_busy=True)  # busy: the last good fit stays
            calibrate.use(cal)
            self.calibration = cal
            with g.lock:
                if self.dash.session.lm is lm:
                    self.dash.session.trace.calibration = cal.to_dict()
                self.calibration_text.value = (
                    f"Calibration in use for {lm.info.name} ({cal.device}, {cal.dtype}, "
                    f"{cal.threads} threads; measured in {time.perf_counter() - t0:.0f} s): "
                    f"{cal.summary()}"
                )
                self.show_trust()
            g.say(
                f"Calibrated on {cal.n_train} steps; held-out median error "
                f"{cal.heldout_err_before_pct:.0f}% (roofline bound) -> "
                f"{cal.heldout_err_after_pct:.0f}% (calibrated) on {cal.n_heldout} steps.",
                "ok",
            )
        except Exception as err:  # noqa: BLE001 - shown; the previous calibration stays in use
            g.fail(err, "Calibration")
        finally:
            g.finish()
