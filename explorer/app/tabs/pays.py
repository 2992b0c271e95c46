"""The "Where does it pay?" tab: one trick against its baseline over one setting (the pays sweep).

Pick a trick and the setting it sweeps (both from explorer.sweeps.pays' registry), type the values,
Run: the sweep runs on the dashboard's model on a background thread with its progress; Stop ends it
after the current setting and keeps the rows so far (the chart's title and the status say PARTIAL).
The chart (explorer.plots.pays_chart) draws the measured speedup beside the cost model's prediction,
the 1x line, both crossovers and the baseline's regime behind them; the why lines under it say, per
region, why the trick pays there or not.
"""

from __future__ import annotations

import html
import threading
import time

import ipywidgets as W

from explorer import plots, sweeps
from explorer.app.controls import button, labelled, stop_button, tagged
from explorer.app.export import download_link
from explorer.app.tabs import Tab, register
from explorer.app.views import figure_widget
from explorer.costs.noise import noisy_summary


def _tricks():
    from explorer.sweeps import pays

    return pays


@register(42)
class PaysTab(Tab):
    """Trick, setting, values, repeats; Run / Stop / progress; the chart and its why lines."""

    name, title = "pays", "Where does it pay?"
    about = (
        "One optimisation against its baseline, measured side by side at each value of one "
        "setting: the speedup (solid; dotted: what the cost model predicts) against the 1x line. "
        "Above the line the trick pays, below it costs; the shading is the baseline's regime "
        "(memory, compute or overhead), and the lines under the chart say why, region by region."
    )

    def __init__(self, dash):
        super().__init__(dash)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.frame = None  # the last run's DataFrame
        pays = _tricks()
        box = labelled(self.parts, "pays", "70px")
        options = [(f"{pays.get_trick(n).title} ({n})", n) for n in pays.names()]
        self.trick = box(W.Dropdown, "trick", pays.names()[0], "trick", "330px", options=options)
        self.axis = box(W.Dropdown, "axis", None, "over", "330px", options=[])
        self.values = box(W.Text, "values", "", "values", "330px", continuous_update=False)
        self.repeats = box(W.IntText, "repeats", 3, "repeats", "150px")
        self.run_button = button(
            "pays-run", "Run", "play", "primary", "run the trick over the values"
        )
        self.stop_button = stop_button(
            "pays-stop", "stop after the current setting (the rows so far are kept)", self.stop
        )
        self.progress = tagged(
            W.IntProgress(value=0, min=0, max=1, layout=W.Layout(width="220px")), "pays-progress"
        )
        self.status = tagged(W.HTML(value=""), "pays-status")
        self.why = tagged(W.HTML(value=""), "pays-why")
        self.chart = figure_widget(plots.pays_figure)
        self.chart.add_class("ie-pays-chart")
        self.parts.update(
            {
                "pays-run": self.run_button,
                "pays-stop": self.stop_button,
                "pays-progress": self.progress,
                "pays-status": self.status,
                "pays-why": self.why,
                "pays-chart": self.chart,
            }
        )
        self.trick.observe(lambda ch: self.trick_changed(), names="value")
        self.axis.observe(lambda ch: self.axis_changed(), names="value")
        self.run_button.on_click(lambda _: self.start())
        self.widget = W.VBox(
            [
                W.HBox([self.trick, self.axis]),
                W.HBox([self.values, self.repeats]),
                W.HBox([self.run_button, self.stop_button, self.progress]),
                self.status,
                self.chart,
                self.why,
            ]
        )
        self.widget.add_class("ie-pays")
        self.parts["pays"] = self.widget
        self.trick_changed()

    # --- the boxes ---

    def trick_changed(self) -> None:
        """The trick's axes in the axis box (its first chosen), its help as the status."""
        trick = _tricks().get_trick(self.trick.value)
        # the names only: an option's help would be clipped by the box; the status line says it
        self.axis.options = [(a.name, a.name) for a in trick.axes]
        self.axis.value = trick.axes[0].name
        self.axis_changed()

    def axis_changed(self) -> None:
        """The axis's default values in the values box."""
        if self.axis.value is None:
            return
        axis = _tricks().get_trick(self.trick.value).axis(self.axis.value)
        self.values.value = ", ".join(
            f"{v:g}" if isinstance(v, float) else str(v) for v in axis.default
        )
        trick = _tricks().get_trick(self.trick.value)
        self.status.value = html.escape(
            f"{trick.title}: against {trick.baseline}; each figure times {trick.unit}. "
            f"Over {axis.name}: {axis.help}"
        )

    def arguments(self) -> dict:
        """The sweep's keywords from the boxes (ValueError: one line naming the box)."""
        repeats = self.repeats.value
        if not 1 <= repeats <= 50:
            raise ValueError(f"repeats must be between 1 and 50, got {repeats}")
        kwargs = sweeps.get("pays").arguments(
            {"trick": self.trick.value, "over": self.axis.value, "values": self.values.value}
        )
        if "values" not in kwargs:
            raise ValueError("values: give at least one value, comma-separated")
        return {**kwargs, "repeats": repeats}

    # --- the Tab protocol ---

    def figures(self):
        return [self.chart]

    def export_figures(self) -> dict:
        return {"pays": self.chart}

    def threads(self):
        return [self._thread]

    def set_busy(self, busy: bool) -> None:
        for w in (self.trick, self.axis, self.values, self.repeats, self.run_button):
            w.disabled = busy
        self.stop_button.disabled = not busy or self._thread is None

    # --- running ---

    def start(self) -> bool:
        """Check the boxes, then run the sweep on a background thread; False if it did not start."""
        g = self.dash.guard
        try:
            kwargs = self.arguments()
        except ValueError as err:
            g.fail(err, "Where does it pay?")
            return False
        if not g.start("The pays sweep"):
            return False
        self._stop.clear()
        self.progress.value = 0
        lm = self.dash.session.lm
        self.in_background(
            f"Running {kwargs['trick']} over {kwargs.get('over') or 'its first setting'} on "
            f"{lm.info.name}… (Stop keeps the rows so far)",
            self._run,
            lm,
            kwargs,
            name="explorer-pays",
        )
        return True

    def stop(self) -> None:
        """Ask the running sweep to stop after its current setting (its rows are kept and drawn)."""
        self._stop.set()
        self.dash.guard.say("Stopping after the current setting…", "busy")

    def _run(self, lm, kwargs: dict) -> None:
        g = self.dash.guard

        def tick(done: int, total: int) -> None:
            self.progress.max, self.progress.value = max(total, 1), done

        t0 = time.perf_counter()
        try:
            df = sweeps.run("pays", lm, progress=tick, bar=False, stop=self._stop, **kwargs)
            self.show(df)
            notes = df.attrs.get("notes") or []
            g.say(
                f"{kwargs['trick']} finished in {time.perf_counter() - t0:.1f} s ({len(df)} rows)"
                + (" (partial)" if df.attrs.get("partial") else "")
                + (": " + "; ".join(notes) if notes else "."),
                "info" if notes else "ok",
            )
        except Exception as err:  # noqa: BLE001 - shown; the chart keeps the previous run
            g.fail(err, f"The {kwargs['trick']} sweep")
        finally:
            g.finish()

    def show(self, df) -> None:
        """Redraw the chart, the why lines and the status from a pays DataFrame."""
        plots.redraw(self.chart, plots.pays_chart(df))
        self.frame = df
        self.why.value = "".join(
            f"<div>{html.escape(line)}</div>" for line in plots.pays_why_lines(df)
        )
        a = df.attrs
        notes = a.get("notes") or []
        where = (
            f"{a.get('model', '')} on {a.get('device', '')} {a.get('dtype', '')}, a low quantile "
            f"of {a.get('repeats')} repeats; each figure times {a.get('unit', '')}"
        )
        noisy = noisy_summary(df.get("noisy"), df.get("noisy_reason"))
        notes = ([noisy] if noisy else []) + list(notes)
        partial = "<b>PARTIAL</b>: stopped before its last setting · " if a.get("partial") else ""
        link = download_link(
            df.to_csv(index=False), f"pays-{a.get('trick', '')}.csv", "table (CSV)"
        )
        self.status.value = (
            f"{partial}{len(df)} rows · {html.escape(where)}"
            + "".join(f"<br>note: {html.escape(n)}" for n in notes)
            + f"<br>{link}"
        )
