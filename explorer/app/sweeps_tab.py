"""The Sweeps tab: explorer.experiments over the dashboard's current model, each with Run, progress, chart.

A sweep runs on a background thread (the kernel stays responsive; conflicting controls are off
until it ends). It returns a DataFrame; the chart is redrawn from it once, at the end. A sweep
that fails halfway leaves its chart as it was and says why; one that runs out of memory stops
itself and keeps its rows (experiments notes say where it stopped).
"""

from __future__ import annotations

import threading
import time

import ipywidgets as W

from explorer import plots
from explorer.app.export import download_link
from explorer.app.views import figure_widget, refit

# (what the sizes box holds, its default, the help text)
SIZES = {
    "cache": ("new tokens", "48", "tokens generated with the cache on, then off (batch 1)"),
    "prefill": ("context lengths", "16, 32, 64, 128, 256, 512", "prompt lengths: one prefill and one decode pass each"),
    "batch": ("batch sizes", "1, 2, 4, 8, 16, 32, 64", "decode passes of B rows at context 128"),
    "dtype": ("dtypes", "float32, bfloat16", "the model converted to each (float16 is slow on most CPUs)"),
}
TITLES = {"cache": "KV cache on/off", "prefill": "Prefill vs decode", "batch": "Batch size", "dtype": "dtype"}


class SweepsTab:
    def __init__(self, dash):
        self.dash = dash
        self._thread: threading.Thread | None = None
        self.frames: dict[str, object] = {}  # the last DataFrame of each sweep
        self.parts: dict[str, W.Widget] = {}
        self.charts: dict[str, object] = {}
        self.repeats = _cls(W.IntText(value=3, description="repeats", continuous_update=False,
                                      layout=W.Layout(width="160px")), "sweep-repeats")
        self.parts["sweep-repeats"] = self.repeats
        pages = [self._page(kind) for kind in plots.SWEEPS]
        self.inner = W.Tab(children=pages, titles=[TITLES[k] for k in plots.SWEEPS])
        self.inner.observe(lambda ch: [refit(f) for f in self.shown_figures()], names="selected_index")
        self.widget = W.VBox([W.HTML("Each sweep times the current model on this machine (median of the repeats, "
                                     "device-synchronised) next to the roofline bound (modelled: dotted)."),
                              self.repeats, self.inner])
        self.widget.add_class("ie-sweeps")

    def _page(self, kind: str) -> W.Widget:
        label, default, help_text = SIZES[kind]
        sizes = _cls(W.Text(value=default, description=label, continuous_update=False,
                            layout=W.Layout(width="420px"), style={"description_width": "110px"}),
                     f"sweep-{kind}-sizes")
        run = _cls(W.Button(description="Run", icon="play", button_style="primary", tooltip=help_text),
                   f"sweep-{kind}-run")
        progress = _cls(W.IntProgress(value=0, min=0, max=1, layout=W.Layout(width="260px")), f"sweep-{kind}-progress")
        status = _cls(W.HTML(value=help_text), f"sweep-{kind}-status")
        chart = figure_widget(plots.sweep_figure, kind)
        chart.add_class(f"ie-sweep-{kind}")
        run.on_click(lambda _: self.start(kind))
        self.charts[kind] = chart
        self.parts.update({f"sweep-{kind}-sizes": sizes, f"sweep-{kind}-run": run,
                           f"sweep-{kind}-progress": progress, f"sweep-{kind}-status": status,
                           f"sweep-{kind}": chart})
        return W.VBox([W.HBox([sizes, run, progress]), status, chart])

    # --- host hooks ---

    def figures(self):
        return list(self.charts.values())

    def shown_figures(self):
        """The chart of the sweep whose inner tab is selected."""
        index = self.inner.selected_index
        return [] if index is None else [self.charts[plots.SWEEPS[index]]]

    def threads(self):
        return [self._thread]

    def set_busy(self, busy: bool) -> None:
        for name, widget in self.parts.items():
            if name.endswith("-run") or name.endswith("-sizes") or name == "sweep-repeats":
                widget.disabled = busy

    # --- running ---

    def start(self, kind: str) -> bool:
        """Validate the sizes, then run the sweep on a background thread. False if it did not start."""
        g = self.dash.guard
        try:
            kwargs = self.arguments(kind)
        except ValueError as err:
            g.fail(err, f"The {TITLES[kind]} sweep")
            return False
        if not g.start(f"The {TITLES[kind]} sweep"):
            return False
        self.parts[f"sweep-{kind}-progress"].value = 0
        g.say(f"Running the {TITLES[kind]} sweep on {self.dash.session.lm.info.name}…", "busy")
        self._thread = threading.Thread(target=self._run, args=(kind, self.dash.session.lm, kwargs),
                                        name=f"explorer-sweep-{kind}", daemon=True)
        self._thread.start()
        return True

    def arguments(self, kind: str) -> dict:
        """The sweep's keyword arguments from the boxes (ValueError with a readable message)."""
        repeats = self.repeats.value
        if not 1 <= repeats <= 50:
            raise ValueError(f"repeats must be between 1 and 50, got {repeats}")
        text = self.parts[f"sweep-{kind}-sizes"].value
        if kind == "dtype":
            names = [t.strip() for t in text.split(",") if t.strip()]
            if not names:
                raise ValueError("name at least one dtype, e.g. float32, bfloat16")
            return {"dtypes": names, "repeats": repeats}
        sizes = _ints(text, SIZES[kind][0])
        if kind == "cache":
            if len(sizes) != 1:
                raise ValueError(f"the cache sweep takes one number of new tokens, got {text!r}")
            return {"new_tokens": sizes[0], "repeats": repeats}
        if kind == "prefill":
            return {"lengths": sizes, "repeats": repeats}
        return {"batches": sizes, "repeats": repeats}

    def _run(self, kind: str, lm, kwargs: dict) -> None:
        from explorer import experiments

        g = self.dash.guard
        progress = self.parts[f"sweep-{kind}-progress"]

        def tick(done: int, total: int) -> None:
            progress.max, progress.value = max(total, 1), done

        t0 = time.perf_counter()
        try:
            df = getattr(experiments, kind)(lm, progress=tick, bar=False, **kwargs)
            self.show(kind, df)
            notes = df.attrs.get("notes") or []
            g.say(f"The {TITLES[kind]} sweep finished in {time.perf_counter() - t0:.1f} s ({len(df)} rows)"
                  + (": " + "; ".join(notes) if notes else "."), "info" if notes else "ok")
        except Exception as err:  # noqa: BLE001 - shown; the chart keeps the previous run
            g.fail(err, f"The {TITLES[kind]} sweep")
        finally:
            g.finish()

    def show(self, kind: str, df) -> None:
        """Redraw a sweep's chart and status from its DataFrame."""
        chart = self.charts[kind]
        plots.replace(chart, plots.sweep_columns(kind, df))
        extras = plots.sweep_shapes(kind, df)
        with chart.batch_update():  # plotly_relayout({"shapes": [...]}) leaves layout.shapes unchanged
            chart.layout.shapes = extras["shapes"]
            if "title.text" in extras:
                chart.layout.title.text = extras["title.text"]
        self.frames[kind] = df
        a = df.attrs
        notes = a.get("notes") or []
        where = f"{a.get('model', '')} on {a.get('device', '')} {a.get('dtype', '')}, median of {a.get('repeats')} " \
                f"repeats, timer: {a.get('timer', '')}"
        link = download_link(df.to_csv(index=False), f"sweep-{kind}.csv", "table (CSV)")
        self.parts[f"sweep-{kind}-status"].value = (
            f"{len(df)} rows · {where}" + ("".join(f"<br>note: {n}" for n in notes)) + f"<br>{link}")


def _cls(widget, name: str):
    widget.add_class(f"ie-{name}")
    return widget


def _ints(text: str, what: str) -> list[int]:
    parts = [p.strip() for p in text.replace(";", ",").split(",") if p.strip()]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"{what} must be whole numbers separated by commas, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise ValueError(f"{what} must be whole numbers >= 1 separated by commas, got {text!r}")
    return values
