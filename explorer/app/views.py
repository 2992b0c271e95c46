"""Live views: FigureWidgets that append a step's columns (explorer.plots) instead of rebuilding.

Each LiveChart keeps the numpy columns it shows; `append(steps)` concatenates the new steps'
columns and sends them, with any layout change, as one Plotly.update (one message, one redraw;
numeric arrays travel as binary buffers). `reset(steps)` rebuilds from a list of steps (after a
rewind, a branch, a new session).
"""

from __future__ import annotations

import functools
import html
from collections.abc import Callable, Sequence
from copy import deepcopy

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go

from explorer import plots
from explorer.engine.trace import Step


@functools.lru_cache(maxsize=64)
def _spec(builder: Callable[..., go.Figure], args: tuple) -> dict:
    """builder(*args) as a dict, with the live views' axis settings (built once per process)."""
    spec = builder(*args).to_dict()
    for key, axis in spec.get("layout", {}).items():
        if key.startswith(("xaxis", "yaxis")) and isinstance(axis, dict):
            # Live views skip plotly.js's tick-label measuring, the larger part of a Step's redraw in Chromium
            # (profiled): automargin measures every label and draws the figure again when a margin changes;
            # the default "hide past div" overflow check measures every label again (getBoundingClientRect).
            axis.update(automargin=False, ticklabeloverflow="allow")
    return spec


def figure_widget(builder: Callable[..., go.Figure], *args) -> go.FigureWidget:
    """A FigureWidget of plots.<builder>(*args), layout in the constructor. The built figure is cached per
    process as a dict (make_subplots figures take ~0.1-0.2 s to build; a widget from the dict ~20 ms)."""
    from explorer.app.voila.assets import (
        figure_widget_class,  # under `explorer app`: plotly's JS fetched once per page
    )

    return figure_widget_class()(deepcopy(_spec(builder, args)))


def refit(fig: go.FigureWidget) -> None:
    """Ask the browser to size the figure to its container again (a figure first drawn inside a hidden
    tab gets plotly's default 700 px)."""
    fig.plotly_relayout({"autosize": True})


def resync(fig: go.FigureWidget) -> None:
    """Copy the Python-side figure into its synced traits, so a view created now shows current data.

    (FigureWidget does this only when displayed on its own; inside a container it would show the
    data it had when constructed.)
    """
    fig._widget_data = deepcopy(fig._data)
    fig._widget_layout = deepcopy(fig._layout_obj._props)


class LiveChart:
    """A FigureWidget built from a plots.*_figure() (layout in the constructor) plus its data buffers.

    While hidden (`live=False`, e.g. its tab is not selected) appends only grow the buffers; the
    figure catches up in one message when it is shown again (`set_live(True)`) or flushed.
    """

    def __init__(
        self,
        figure: go.FigureWidget,
        columns: Callable[[Sequence[Step]], plots.Columns],
        css: str,
        keep_last: int | None = None,
        live: bool = True,
    ):
        self.fig = figure  # built with its layout in the constructor (plotly 7 keeps it)
        self.fig.add_class(f"ie-{css}")
        self.columns = columns
        self.keep_last = keep_last
        self.buffers: plots.Columns = {}
        self.live = live
        self.stale = False  # buffers hold data the figure does not show yet
        self.layout: dict = {}  # relayout paths waiting to be sent with the next data

    def append(self, steps: Sequence[Step], layout: dict | None = None) -> None:
        """Add `steps` (and apply `layout`, relayout paths such as the x range) in one message."""
        if not steps:
            return
        self.buffers = plots.concat(self.buffers, self.columns(steps), keep_last=self.keep_last)
        self._send(layout)

    def reset(self, steps: Sequence[Step] = (), layout: dict | None = None) -> None:
        """Show exactly `steps` (the last keep_last of them)."""
        empty = {
            name: {prop: arr[:0] for prop, arr in props.items()}
            for name, props in self.buffers.items()
        }
        steps = list(steps)
        self.buffers = (
            plots.concat(empty, self.columns(steps[-self.keep_last :] if self.keep_last else steps))
            if steps
            else empty
        )
        self._send(layout)

    def set_live(self, live: bool) -> None:
        self.live = live
        if live:
            self.flush()

    def flush(self) -> None:
        """Send what the buffers hold (and the layout change waiting) if the figure is behind."""
        if self.stale or self.layout:
            plots.replace(self.fig, self.buffers if self.stale else {}, self.layout)
            self.stale, self.layout = False, {}

    def _send(self, layout: dict | None = None) -> None:
        self.stale = True
        self.layout.update(layout or {})
        if self.live:
            self.flush()

    def resync(self) -> None:
        self.flush()
        resync(self.fig)

    def point_count(self, name: str) -> int:
        trace = next(t for t in self.fig.data if t.name == name)
        return 0 if trace.x is None else len(trace.x)


class StripText:
    """The generated text as coloured spans (an HTML widget, class ie-strip-text), windowed.

    Spans are built once per token and kept; the widget shows the prompt and the last `window`
    tokens, so a step costs the same at step 1,000 as at step 10.
    """

    def __init__(self, window: int = 250):
        self.window = window
        self.widget = W.HTML(value="", layout=W.Layout(width="100%"))
        self.widget.add_class("ie-strip-text")
        self.prompt_html = ""
        self.spans: list[str] = []

    def set_prompt(self, prompt: str) -> None:
        self.prompt_html = (
            f'<span class="ie-prompt" style="color:#777">{html.escape(prompt)}</span>'
        )

    def reset(self, steps: Sequence[Step], color_by: str = "prob") -> None:
        self.spans = [self.span(s, color_by) for s in steps]
        self.render()

    def append(self, steps: Sequence[Step], color_by: str = "prob") -> None:
        self.spans.extend(self.span(s, color_by) for s in steps)
        self.render()

    def render(self) -> None:
        hidden = len(self.spans) - self.window
        shown = self.spans[-self.window :]
        more = f'<span style="color:#999">[… {hidden} earlier tokens] </span>' if hidden > 0 else ""
        self.widget.value = (
            '<div style="font-family:ui-monospace,Menlo,Consolas,monospace;font-size:14px;white-space:pre-wrap;'
            'line-height:1.7;padding:6px;border:1px solid #ddd;border-radius:4px;max-height:9em;overflow-y:auto">'
            f"{self.prompt_html}{more}{''.join(shown)}</div>"
        )

    @staticmethod
    def span(s: Step, color_by: str = "prob") -> str:
        value = s.prob_final if color_by == "prob" else max(0.0, 1.0 - s.entropy_final / 5.0)
        hue = int(120 * min(max(value, 0.0), 1.0))  # red (unlikely / uncertain) -> green
        border = "border-bottom:2px solid #222;" if s.phase == "prefill" else ""
        deco = "text-decoration:underline wavy #555;" if s.forced else ""
        title = html.escape(
            f"step {s.index}: id {s.token_id}, p={s.prob_final:.3f}, H={s.entropy_final:.2f}"
            + (" (forced)" if s.forced else ""),
            quote=True,
        )
        return (
            f'<span class="ie-tok" data-step="{s.index}" title="{title}" '
            f'style="background:hsl({hue},70%,85%);{border}{deco}">{html.escape(s.token_text)}</span>'
        )


class Distribution:
    """The distribution panels of one selected step (replaced per selection: ~20 bars, 5 stages).

    `widget` holds the step's title (HTML, class ie-dist-title) above the chart (`fig`, class ie-dist).
    """

    EMPTY = "Next-token distribution (press Step)"
    HINT = "click a bar to choose that token here (branch)"
    CAPTION = (
        '<div style="font-size:12px;color:#555;padding:0 8px">Stages: each bar is the share of '
        "the probability mass entering that stage (temperature, top-k, top-p, min-p, ...) that "
        "the stage keeps, so a later bar can be higher than an earlier one; the number on it is "
        "how many tokens are still allowed after it.</div>"
    )

    def __init__(self):
        self.fig = figure_widget(plots.distribution_figure, False)
        self.fig.add_class("ie-dist")
        self.title = W.HTML(value=self._title_html(self.EMPTY))
        self.title.add_class("ie-dist-title")
        stages = next(a for a in self.fig.layout.annotations if a.text.startswith("stages"))
        stages.text = "stages: mass kept · tokens kept"  # shown before display (resynced)
        self.caption = W.HTML(value=self.CAPTION)
        self.caption.add_class("ie-dist-caption")
        self.widget = W.VBox([self.title, self.fig, self.caption], layout=W.Layout(width="100%"))
        self.step: Step | None = None
        self.top_n: int | None = None

    def show(self, step: Step | None, top_n: int | None) -> None:
        self.step, self.top_n = step, top_n
        if step is None:
            cols = {t.name: {"x": np.empty(0), "y": np.empty(0)} for t in self.fig.data}
            plots.replace(self.fig, cols, {"xaxis.tickvals": [], "xaxis.ticktext": []})
            self.title.value = self._title_html(self.EMPTY)
            return
        self.title.value = self._title_html(plots.distribution_title(step), self.HINT)
        plots.replace(
            self.fig,
            plots.distribution_columns(step, top_n),
            plots.distribution_labels(step, top_n, False),
        )

    def figure(self) -> go.Figure:
        """The panels as a standalone figure with their title (for export)."""
        return (
            plots.distribution(self.step, self.top_n)
            if self.step is not None
            else go.Figure(self.fig)
        )

    def token_at(self, point_index: int) -> int:
        """The token id of the bar at point_index (customdata of the 'final' trace)."""
        final = next(t for t in self.fig.data if t.name == "final")
        return int(final.customdata[point_index])

    @staticmethod
    def _title_html(text: str, hint: str = "") -> str:
        hint = (
            f' <span style="font-size:12px;color:#777">· {html.escape(hint)}</span>' if hint else ""
        )
        return f'<div style="font-size:15px;padding:4px 0 0 8px;color:#222">{html.escape(text)}{hint}</div>'
