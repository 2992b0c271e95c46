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
import time

import ipywidgets as W

from explorer import plots, sweeps
from explorer.app.controls import button, labelled, stop_button, tagged
from explorer.app.export import download_link
from explorer.app.runner import Runner
from explorer.app.tabs import Tab, register
from explorer.app.views import figure_widget
from explorer.costs.noise import noisy_summary


def _tricks():
    from explorer.sweeps import pays

    return pays


def build() -> tuple[W.Widget, dict]:
    """The tab's widget and its parts (name -> widget, CSS class ie-<name>); no callbacks."""
    pays = _tricks()
    parts: dict = {}
    box = labelled(parts, "pays", "70px")
    options = [(f"{pays.get_trick(n).title} ({n})", n) for n in pays.names()]
    box(W.Dropdown, "trick", pays.names()[0], "trick", "330px", options=options)
    box(W.Dropdown, "axis", None, "over", "330px", options=[])
    box(W.Text, "values", "", "values", "330px", continuous_update=False)
    box(W.IntText, "repeats", 3, "repeats", "150px")
    parts["pays-run"] = button(
        "pays-run", "Run", "play", "primary", "run the trick over the values"
    )
    parts["pays-stop"] = stop_button(
        "pays-stop", "stop after the current setting (the rows so far are kept)"
    )
    parts["pays-progress"] = tagged(
        W.IntProgress(value=0, min=0, max=1, layout=W.Layout(width="220px")), "pays-progress"
    )
    parts["pays-status"] = tagged(W.HTML(value=""), "pays-status")
    parts["pays-why"] = tagged(W.HTML(value=""), "pays-why")
    parts["pays-chart"] = figure_widget(plots.pays_figure)
    parts["pays-chart"].add_class("ie-pays-chart")
    rows = (("trick", "axis"), ("values", "repeats"), ("run", "stop", "progress"))
    widget = W.VBox(
        [W.HBox([parts[f"pays-{n}"] for n in row]) for row in rows]
        + [parts["pays-status"], parts["pays-chart"], parts["pays-why"]]
    )
    widget.add_class("ie-pays")
    parts["pays"] = widget
    return widget, parts


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
        self.frame = None  # the last run's DataFrame
        self.widget, self.parts = build()
        p = self.parts
        self.runner = Runner(
            self,
            "The pays sweep",
            controls=[p[n] for n in ("pays-trick", "pays-axis", "pays-values", "pays-repeats")]
            + [p["pays-run"]],
            stop=p["pays-stop"],
            progress=p["pays-progress"],
            stopping="Stopping after the current setting…",
            unit="settings",
        )
        p["pays-trick"].observe(lambda ch: self.trick_changed(), names="value")
        p["pays-axis"].observe(lambda ch: self.axis_changed(), names="value")
        p["pays-run"].on_click(lambda _: self.start())
        self.trick_changed()

    # --- the boxes ---

    def trick_changed(self) -> None:
        """The trick's axes in the axis box (its first chosen), its help as the status."""
        trick = _tricks().get_trick(self.parts["pays-trick"].value)
        # the names only: an option's help would be clipped by the box; the status line says it
        self.parts["pays-axis"].options = [(a.name, a.name) for a in trick.axes]
        self.parts["pays-axis"].value = trick.axes[0].name
        self.axis_changed()

    def axis_changed(self) -> None:
        """The axis's default values in the values box."""
        p = self.parts
        if p["pays-axis"].value is None:
            return
        trick = _tricks().get_trick(p["pays-trick"].value)
        axis = trick.axis(p["pays-axis"].value)
        p["pays-values"].value = ", ".join(
            f"{v:g}" if isinstance(v, float) else str(v) for v in axis.default
        )
        p["pays-status"].value = html.escape(
            f"{trick.title}: against {trick.baseline}; each figure times {trick.unit}. "
            f"Over {axis.name}: {axis.help}"
        )

    def arguments(self) -> dict:
        """The sweep's keywords from the boxes (ValueError: one line naming the box)."""
        p = self.parts
        repeats = p["pays-repeats"].value
        if not 1 <= repeats <= 50:
            raise ValueError(f"repeats must be between 1 and 50, got {repeats}")
        kwargs = sweeps.get("pays").arguments(
            {
                "trick": p["pays-trick"].value,
                "over": p["pays-axis"].value,
                "values": p["pays-values"].value,
            }
        )
        if "values" not in kwargs:
            raise ValueError("values: give at least one value, comma-separated")
        return {**kwargs, "repeats": repeats}

    # --- the Tab protocol ---

    def figures(self):
        return [self.parts["pays-chart"]]

    def export_figures(self) -> dict:
        return {"pays": self.parts["pays-chart"]}

    # --- running ---

    def start(self) -> bool:
        """Check the boxes, then run the sweep on a background thread; False if it did not start."""
        try:
            kwargs = self.arguments()
        except ValueError as err:
            self.dash.guard.fail(err, "Where does it pay?")
            return False
        lm = self.dash.session.lm
        return self.runner.start(
            f"Running {kwargs['trick']} over {kwargs.get('over') or 'its first setting'} on "
            f"{lm.info.name}… (Stop keeps the rows so far)",
            self._run,
            lm,
            kwargs,
            doing=f"The {kwargs['trick']} sweep",
        )

    def stop(self) -> None:
        """Ask the running sweep to stop after its current setting (its rows are kept and drawn)."""
        self.runner.stop()

    def _run(self, lm, kwargs: dict) -> None:
        r = self.runner
        t0 = time.perf_counter()
        df = sweeps.run("pays", lm, progress=r.tick, bar=False, stop=r.stop_event, **kwargs)
        self.show(df)
        notes = df.attrs.get("notes") or []
        r.finished(
            f"{kwargs['trick']} finished in {time.perf_counter() - t0:.1f} s ({len(df)} rows)"
            + (": " + "; ".join(notes) if notes else "."),
            partial=bool(df.attrs.get("partial")),
            notes=bool(notes),
        )

    def show(self, df) -> None:
        """Redraw the chart, the why lines and the status from a pays DataFrame."""
        plots.redraw(self.parts["pays-chart"], plots.pays_chart(df))
        self.frame = df
        self.parts["pays-why"].value = "".join(
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
        self.parts["pays-status"].value = (
            f"{partial}{len(df)} rows · {html.escape(where)}"
            + "".join(f"<br>note: {html.escape(n)}" for n in notes)
            + f"<br>{link}"
        )
