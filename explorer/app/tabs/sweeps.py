"""The Sweeps tab: explorer.sweeps over the dashboard's current model, each with Run, progress, chart.

A sweep runs on a background thread (the kernel stays responsive; conflicting controls are off
until it ends). It returns a DataFrame; the chart is redrawn from it once, at the end. A sweep
that fails halfway leaves its chart as it was and says why; one that runs out of memory stops
itself and keeps its rows (the frame's notes say where it stopped), and so does one that is Stopped.
"""

from __future__ import annotations

import time

import ipywidgets as W

from explorer import plots, sweeps
from explorer.app.controls import stop_button, tagged
from explorer.app.export import download_link
from explorer.app.runner import Runner
from explorer.app.tabs import Tab, register
from explorer.app.views import figure_widget, refit
from explorer.costs.noise import noisy_summary


def build() -> tuple[W.Widget, dict]:
    """The tab's widget and its parts (name -> widget, CSS class ie-<name>); no callbacks.
    Per sweep: its size boxes (the first "sweep-<name>-sizes", any further one
    "sweep-<name>-<param>"), "-run", "-progress", "-status" and its chart "sweep-<name>"."""
    parts: dict = {}
    parts["sweep-repeats"] = tagged(
        W.IntText(
            value=3, description="repeats", continuous_update=False, layout=W.Layout(width="160px")
        ),
        "sweep-repeats",
    )
    parts["sweep-stop"] = stop_button(
        "sweep-stop", "stop the running sweep after its current point (rows kept)"
    )
    names = sweeps.names()
    pages = [_page(parts, sweeps.get(n)) for n in names]
    parts["sweep-pages"] = tagged(
        W.Tab(children=pages, titles=[sweeps.get(n).title for n in names]), "sweep-pages"
    )
    widget = W.VBox([W.HBox([parts["sweep-repeats"], parts["sweep-stop"]]), parts["sweep-pages"]])
    widget.add_class("ie-sweeps")
    parts["sweeps"] = widget
    return widget, parts


def size_boxes(sweep) -> dict[str, str]:
    """A sweep's size parameters (repeats has its own box, shared by all) -> their parts."""
    boxes = [p for p in sweep.params if p.name != "repeats"]
    return {
        p.name: f"sweep-{sweep.name}-sizes" if i == 0 else f"sweep-{sweep.name}-{p.name}"
        for i, p in enumerate(boxes)
    }


def _page(parts: dict, sweep) -> W.Widget:
    """One sweep's page: its size boxes, Run, progress, status and chart (added to parts)."""
    boxes = []
    for param in sweep.params:
        part = size_boxes(sweep).get(param.name)
        if part is None:
            continue
        parts[part] = tagged(
            W.Text(
                value=param.default or "",
                description=param.label,
                continuous_update=False,
                layout=W.Layout(width="420px"),
                style={"description_width": "110px"},
            ),
            part,
        )
        boxes.append(parts[part])
    key = f"sweep-{sweep.name}"
    parts[f"{key}-run"] = tagged(
        W.Button(description="Run", icon="play", button_style="primary", tooltip=sweep.help),
        f"{key}-run",
    )
    parts[f"{key}-progress"] = tagged(
        W.IntProgress(value=0, min=0, max=1, layout=W.Layout(width="260px")), f"{key}-progress"
    )
    parts[f"{key}-status"] = tagged(W.HTML(value=sweep.help), f"{key}-status")
    parts[key] = figure_widget(plots.sweep_figure, sweep.name)
    parts[key].add_class(f"ie-{key}")
    first, *rest = boxes
    return W.VBox(
        [
            W.HBox([first, parts[f"{key}-run"], parts[f"{key}-progress"]]),
            *rest,
            parts[f"{key}-status"],
            parts[key],
        ]
    )


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
        self.frames: dict[str, object] = {}  # the last DataFrame of each sweep
        self.names = sweeps.names()
        self.widget, self.parts = build()
        p = self.parts
        self.charts = {n: p[f"sweep-{n}"] for n in self.names}
        self.boxes = {  # sweep -> {param name: its Text box}
            n: {param: p[part] for param, part in size_boxes(sweeps.get(n)).items()}
            for n in self.names
        }
        conflicts = [p["sweep-repeats"], *(w for b in self.boxes.values() for w in b.values())]
        self.runner = Runner(
            self,
            "The sweep",
            controls=conflicts + [p[f"sweep-{n}-run"] for n in self.names],
            stop=p["sweep-stop"],
            stopping="Stopping the sweep after its current point…",
        )
        for n in self.names:
            p[f"sweep-{n}-run"].on_click(lambda _, n=n: self.start(n))
        p["sweep-pages"].observe(
            lambda ch: [refit(f) for f in self.shown_figures()], names="selected_index"
        )
        self._fitted: dict[str, str] = {}  # sweep -> the contexts written for the loaded model
        self.session_changed()

    # --- the Tab protocol ---

    def figures(self):
        return list(self.charts.values())

    def shown_figures(self):
        """The chart of the sweep whose inner tab is selected."""
        index = self.parts["sweep-pages"].selected_index
        return [] if index is None else [self.charts[self.names[index]]]

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

    # --- running ---

    def start(self, name: str) -> bool:
        """Validate the sizes, then run the sweep on a background thread. False if it did not start."""
        title = sweeps.get(name).title
        try:
            kwargs = self.arguments(name)
        except ValueError as err:
            self.dash.guard.fail(err, f"The {title} sweep")
            return False
        self.runner.progress = self.parts[f"sweep-{name}-progress"]
        return self.runner.start(
            f"Running the {title} sweep on {self.dash.session.lm.info.name}… (Stop keeps the rows "
            "so far)",
            self._run,
            name,
            self.dash.session.lm,
            kwargs,
            doing=f"The {title} sweep",
        )

    def stop(self) -> None:
        """Ask the running sweep to stop after its current point (its rows are kept and drawn)."""
        self.runner.stop()

    def arguments(self, name: str) -> dict:
        """The sweep's keyword arguments from the boxes (ValueError with a readable message)."""
        repeats = self.parts["sweep-repeats"].value
        if not 1 <= repeats <= 50:
            raise ValueError(f"repeats must be between 1 and 50, got {repeats}")
        sweep = sweeps.get(name)
        return {
            **sweep.arguments({p: box.value for p, box in self.boxes[name].items()}),
            "repeats": repeats,
        }

    def _run(self, name: str, lm, kwargs: dict) -> None:
        r, title = self.runner, sweeps.get(name).title
        t0 = time.perf_counter()
        df = sweeps.run(name, lm, progress=r.tick, bar=False, stop=r.stop_event, **kwargs)
        self.show(name, df)
        notes = df.attrs.get("notes") or []
        r.finished(
            f"The {title} sweep finished in {time.perf_counter() - t0:.1f} s ({len(df)} rows)"
            + (": " + "; ".join(notes) if notes else "."),
            notes=bool(notes),
        )

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
