"""The Sweeps tab: explorer.sweeps over the dashboard's current model, each with Run, progress, chart.

A sweep runs on a background thread (the kernel stays responsive; conflicting controls are off
until it ends). It returns a DataFrame; the chart is redrawn from it once, at the end. A sweep
that fails halfway leaves its chart as it was and says why; one that runs out of memory stops
itself and keeps its rows (the frame's notes say where it stopped), and so does one that is Stopped.
"""

from __future__ import annotations

import threading
import time

import ipywidgets as W

from explorer import plots, sweeps
from explorer.app.controls import stop_button, tagged
from explorer.app.export import download_link
from explorer.app.tabs import Tab, register
from explorer.app.views import figure_widget, refit
from explorer.costs.noise import noisy_summary


@register(40)
class SweepsTab(Tab):
    """One inner page per registered sweep (explorer.sweeps): its sizes box, Run, Stop, progress, chart."""

    name, title = "sweeps", "Sweeps"
    about = (
        "Each sweep times the current model on this machine over one setting (a low quantile of "
        "the repeats, device-synchronised; an orange ring: a noisy point), solid, next to the roofline bound (modelled), dotted: "
        "where the two lines part, something other than bytes and FLOPs sets the time."
    )

    def __init__(self, dash):
        super().__init__(dash)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.frames: dict[str, object] = {}  # the last DataFrame of each sweep
        self.charts: dict[str, object] = {}
        self.boxes: dict[str, dict[str, object]] = {}  # sweep -> {param name: its Text box}
        self.names = sweeps.names()
        self.repeats = tagged(
            W.IntText(
                value=3,
                description="repeats",
                continuous_update=False,
                layout=W.Layout(width="160px"),
            ),
            "sweep-repeats",
        )
        self.stop_button = stop_button(
            "sweep-stop", "stop the running sweep after its current point (rows kept)", self.stop
        )
        self.parts.update({"sweep-repeats": self.repeats, "sweep-stop": self.stop_button})
        pages = [self._page(sweeps.get(n)) for n in self.names]
        self.inner = W.Tab(children=pages, titles=[sweeps.get(n).title for n in self.names])
        self.inner.observe(
            lambda ch: [refit(f) for f in self.shown_figures()], names="selected_index"
        )
        self.widget = W.VBox(
            [
                W.HBox([self.repeats, self.stop_button]),
                self.inner,
            ]
        )
        self.widget.add_class("ie-sweeps")
        self.parts["sweeps"] = self.widget
        self._fitted: dict[str, str] = {}  # sweep -> the contexts written for the loaded model
        self.session_changed()

    def _page(self, sweep) -> W.Widget:
        # one box per size parameter the person types (repeats has its own box, shared by all);
        # the first is "sweep-<name>-sizes", any further one "sweep-<name>-<param>"
        boxes = {}
        for i, box in enumerate(p for p in sweep.params if p.name != "repeats"):
            part = f"sweep-{sweep.name}-sizes" if i == 0 else f"sweep-{sweep.name}-{box.name}"
            boxes[box.name] = tagged(
                W.Text(
                    value=box.default or "",
                    description=box.label,
                    continuous_update=False,
                    layout=W.Layout(width="420px"),
                    style={"description_width": "110px"},
                ),
                part,
            )
            self.parts[part] = boxes[box.name]
        self.boxes[sweep.name] = boxes
        run = tagged(
            W.Button(description="Run", icon="play", button_style="primary", tooltip=sweep.help),
            f"sweep-{sweep.name}-run",
        )
        progress = tagged(
            W.IntProgress(value=0, min=0, max=1, layout=W.Layout(width="260px")),
            f"sweep-{sweep.name}-progress",
        )
        status = tagged(W.HTML(value=sweep.help), f"sweep-{sweep.name}-status")
        chart = figure_widget(plots.sweep_figure, sweep.name)
        chart.add_class(f"ie-sweep-{sweep.name}")
        run.on_click(lambda _: self.start(sweep.name))
        self.charts[sweep.name] = chart
        self.parts.update(
            {
                f"sweep-{sweep.name}-run": run,
                f"sweep-{sweep.name}-progress": progress,
                f"sweep-{sweep.name}-status": status,
                f"sweep-{sweep.name}": chart,
            }
        )
        first, *rest = boxes.values()
        return W.VBox([W.HBox([first, run, progress]), *rest, status, chart])

    # --- the Tab protocol ---

    def figures(self):
        return list(self.charts.values())

    def shown_figures(self):
        """The chart of the sweep whose inner tab is selected."""
        index = self.inner.selected_index
        return [] if index is None else [self.charts[self.names[index]]]

    def threads(self):
        return [self._thread]

    def session_changed(self) -> None:
        """Context lengths sized to the loaded model (a box the person typed in is left alone)."""
        cap = self.dash.session.lm.info.max_positions
        for name, boxes in self.boxes.items():
            box = boxes.get("contexts")
            if box is None:
                continue
            default = next(p.default for p in sweeps.get(name).params if p.name == "contexts")
            if box.value in (default, self._fitted.get(name)):
                box.value = self._fitted[name] = ", ".join(map(str, fit_contexts(default, cap)))

    def set_busy(self, busy: bool) -> None:
        for name, widget in self.parts.items():
            if name.endswith("-run") or name == "sweep-repeats":
                widget.disabled = busy
        for boxes in self.boxes.values():
            for widget in boxes.values():
                widget.disabled = busy
        self.stop_button.disabled = not busy or self._thread is None

    # --- running ---

    def start(self, name: str) -> bool:
        """Validate the sizes, then run the sweep on a background thread. False if it did not start."""
        g, title = self.dash.guard, sweeps.get(name).title
        try:
            kwargs = self.arguments(name)
        except ValueError as err:
            g.fail(err, f"The {title} sweep")
            return False
        if not g.start(f"The {title} sweep"):
            return False
        self._stop.clear()
        self.parts[f"sweep-{name}-progress"].value = 0
        self.in_background(
            f"Running the {title} sweep on {self.dash.session.lm.info.name}… (Stop keeps the rows so far)",
            self._run,
            name,
            self.dash.session.lm,
            kwargs,
            name=f"explorer-sweep-{name}",
        )
        return True

    def stop(self) -> None:
        """Ask the running sweep to stop after its current point (its rows are kept and drawn)."""
        self._stop.set()
        self.dash.guard.say("Stopping the sweep after its current point…", "busy")

    def arguments(self, name: str) -> dict:
        """The sweep's keyword arguments from the boxes (ValueError with a readable message)."""
        repeats = self.repeats.value
        if not 1 <= repeats <= 50:
            raise ValueError(f"repeats must be between 1 and 50, got {repeats}")
        sweep = sweeps.get(name)
        return {
            **sweep.arguments({p: box.value for p, box in self.boxes[name].items()}),
            "repeats": repeats,
        }

    def _run(self, name: str, lm, kwargs: dict) -> None:
        g, title = self.dash.guard, sweeps.get(name).title
        progress = self.parts[f"sweep-{name}-progress"]

        def tick(done: int, total: int) -> None:
            progress.max, progress.value = max(total, 1), done

        t0 = time.perf_counter()
        try:
            df = sweeps.run(name, lm, progress=tick, bar=False, stop=self._stop, **kwargs)
            self.show(name, df)
            notes = df.attrs.get("notes") or []
            g.say(
                f"The {title} sweep finished in {time.perf_counter() - t0:.1f} s ({len(df)} rows)"
                + (": " + "; ".join(notes) if notes else "."),
                "info" if notes else "ok",
            )
        except Exception as err:  # noqa: BLE001 - shown; the chart keeps the previous run
            g.fail(err, f"The {title} sweep")
        finally:
            g.finish()

    def show(self, name: str, df) -> None:
        """Redraw a sweep's chart and status from its DataFrame."""
        chart = self.charts[name]
        plots.replace(chart, plots.sweep_columns(name, df))
        extras = plots.sweep_shapes(name, df)
        with (
            chart.batch_update()
        ):  # plotly_relayout({"shapes": [...]}) leaves layout.shapes unchanged
            chart.layout.shapes = extras["shapes"]
            if "title.text" in extras:
                chart.layout.title.text = extras["title.text"]
        self.frames[name] = df
        a = df.attrs
        notes = a.get("notes") or []
        where = (
            f"{a.get('model', '')} on {a.get('device', '')} {a.get('dtype', '')}, a low quantile of "
            f"{a.get('repeats')} repeats, timer: {a.get('timer', '')}"
        )
        noisy = noisy_summary(df.get("noisy"), df.get("noisy_reason"))
        notes = ([noisy] if noisy else []) + list(notes)
        link = download_link(df.to_csv(index=False), f"sweep-{name}.csv", "table (CSV)")
        self.parts[f"sweep-{name}-status"].value = (
            f"{len(df)} rows · {where}" + ("".join(f"<br>note: {n}" for n in notes)) + f"<br>{link}"
        )


def fit_contexts(default: str, max_positions: int | None) -> list[int]:
    """The default context lengths that fit a model of max_positions (a context plus the token
    decoded on it); at least three, spread up to the largest that fits."""
    wanted = [int(c) for c in default.replace(",", " ").split()]
    if not max_positions:
        return wanted
    cap = max_positions - 1
    fits = {c for c in wanted if c <= cap}
    if len(fits) < len(wanted):
        fits.add(cap)  # the longest context the model holds, in place of those dropped
    for extra in (cap // 2, cap // 8):
        if len(fits) < 3 and extra >= 2:
            fits.add(extra)
    return sorted(fits)
