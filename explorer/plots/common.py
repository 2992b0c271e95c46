"""What every figure builder shares: the house style, column helpers, and the
append/replace/clear operations on named traces.

Trace / Step / table -> plotly Figure. Pure: no widgets, no model; a saved Trace replays here.

Every live chart is built the same way, so the dashboard can append instead of rebuilding:

    <chart>_figure(...)          -> go.Figure with its layout and empty, *named* traces
    <chart>_columns(steps, ...)  -> {trace name: {property: numpy array}} for those steps
    extend(fig, columns)         -> appends the columns to the named traces (Figure or FigureWidget)

and `<chart>(trace)` draws a whole Trace in one call (figure + extend), for notebooks.
Columns are numpy arrays because plotly sends numeric arrays to the browser as binary buffers
(and validates them ~20x faster than lists), which keeps a step cheap at step 1,000.

What is measured and what is modelled is said on every chart: latency is measured
(perf_counter or CUDA events after a device sync, one forward pass per point); bytes and FLOPs
come from the analytic cost model (explorer.costs); achieved bandwidth and FLOP/s divide the
modelled work by the measured latency.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.basedatatypes import Undefined  # in a restyle: "leave this trace's value as it is"

from explorer.engine.trace import Step

NOISY_COLOR = "#e67e22"  # the badge of a noisy timed figure (explorer.costs.noise)

Columns = dict[str, dict[str, np.ndarray]]

PHASE_COLORS = {"prefill": "#d62728", "decode": "#1f77b4", "previous": "#9e9e9e"}
PART_COLORS = {
    "weights": "#4c72b0",
    "kv_read": "#dd8452",
    "kv_write": "#c44e52",
    "activations": "#55a868",
    "other": "#8c8c8c",
}
TRAFFIC_PARTS = ("weights", "kv_read", "kv_write", "activations", "other")
MB = 1e6
# template "none" plus a few explicit styles: a named template is a large object that plotly copies and
# validates into every figure (~45 ms each, on every FigureWidget the dashboard builds).
_AXIS = dict(
    showgrid=True,
    gridcolor="#ececec",
    zeroline=False,
    linecolor="#bbb",
    ticks="outside",
    tickcolor="#bbb",
    automargin=True,
)
BASE_LAYOUT = dict(
    template="none",
    margin=dict(l=60, r=20, t=60, b=40),
    height=320,
    font=dict(size=12),
    paper_bgcolor="white",
    plot_bgcolor="white",
    hoverlabel=dict(bgcolor="white"),
    xaxis=_AXIS,
    yaxis=_AXIS,
)


def _layout(**kw) -> dict:
    """BASE_LAYOUT with kw on top; axis dicts are merged with the base axis style, not replaced."""
    out = {**BASE_LAYOUT, **kw}
    for axis in ("xaxis", "yaxis"):
        out[axis] = {**_AXIS, **kw.get(axis, {})}
    return out


def _style_axes(fig: go.Figure) -> None:
    """The base axis style on every axis of a figure with subplots."""
    fig.update_xaxes(**_AXIS)
    fig.update_yaxes(**_AXIS)


# Log axes: labelled ticks at 1, 2 and 5 of each decade written out in full ("20", "500", "2k";
# plotly's own log ticks label the 2 and 5 of a decade with a lone small digit), or at each decade
# only where an axis spans more than three decades; SI prefixes (k, M, G, T rather than "B").
_SI = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def si_label(value: float) -> str:
    """A tick label: 2000 -> "2k", 5e9 -> "5G", 0.02 -> "0.02"."""
    for scale, prefix in _SI:
        if value >= scale:
            return f"{value / scale:g}{prefix}"
    return f"{value:g}"


def log_axis(*, wide: bool = False) -> dict:
    """Tick values and labels for a log axis from 1e-6 to 1e15 (plotly draws those in range)."""
    mantissas = (1,) if wide else (1, 2, 5)
    values = [m * 10.0**e for e in range(-6, 16) for m in mantissas]
    return dict(
        tickvals=values,
        ticktext=[si_label(v) for v in values],
        exponentformat="SI",  # for any tick plotly adds itself (hover, a zoomed-in axis)
        minor=dict(ticks=""),
    )


LOG_AXIS = log_axis()
LOG_AXIS_WIDE = log_axis(wide=True)


def _axis_span(fig: go.Figure, axis, letter: str) -> float:
    """Decades spanned by the positive data drawn on `axis` (0 when it has none yet)."""
    ref = axis.plotly_name.replace("axis", "")  # "xaxis2" -> "x2"
    values = []
    for trace in fig.data:
        if (getattr(trace, f"{letter}axis", None) or letter) == ref:
            data = getattr(trace, letter, None)
            if data is not None:
                values.extend(v for v in np.asarray(data, dtype=float).ravel() if v > 0)
    return float(np.log10(max(values) / min(values))) if values else 0.0


def log_ticks(fig: go.Figure) -> go.Figure:
    """The house's log-axis labels on every logarithmic axis of `fig` (decades only past three
    decades of data)."""
    for letter in ("x", "y"):
        for axis in getattr(fig, f"select_{letter}axes")():
            if axis.type == "log" and axis.tickvals is None:  # keep a chart's own ticks
                wide = _axis_span(fig, axis, letter) > 3
                axis.update(LOG_AXIS_WIDE if wide else LOG_AXIS)
    return fig


def _house_style(fig: go.Figure, *, height: int, **layout) -> go.Figure:
    """The house style on a figure built by hand or with subplots: every axis, the white page,
    the margins; `layout` on top (legend, title, ...)."""
    _style_axes(fig)
    fig.update_layout(
        **{
            "height": height,
            "template": "none",
            "paper_bgcolor": "white",
            "plot_bgcolor": "white",
            "margin": dict(l=60, r=20, t=70, b=40),
            "font": dict(size=12),
            **layout,
        }
    )
    return log_ticks(fig)


# --- small helpers -------------------------------------------------------------------------------


def show_token(text: str) -> str:
    """A token as a label: whitespace made visible (space -> ·, newline -> ⏎, tab -> ⇥)."""
    if text == "":
        return "∅"
    return text.replace(" ", "·").replace("\n", "⏎").replace("\t", "⇥").replace("\r", "␍")


def _field(obj: Any, name: str, default=None):
    """A field of a record given as an object or as its plain dict (Trace.rounds holds dicts;
    a Step or its split dict)."""
    return obj.get(name, default) if isinstance(obj, dict) else getattr(obj, name, default)


def _num(x: float | None) -> float:
    return float("nan") if x is None else float(x)


def _peak(peaks: Any, name: str) -> float | None:
    """A field of measured peaks, given as a dict (Trace.hardware) or an object (hardware.Peaks)."""
    if peaks is None:
        return None
    value = peaks.get(name) if isinstance(peaks, dict) else getattr(peaks, name, None)
    return None if value is None else float(value)


def _arr(values: Iterable, dtype=float) -> np.ndarray:
    return np.asarray(list(values), dtype=dtype)


def _objs(values: Iterable) -> np.ndarray:
    out = list(values)
    arr = np.empty(len(out), dtype=object)
    arr[:] = out
    return arr


def extend(fig: go.Figure, columns: Columns, *, keep_last: int | None = None) -> None:
    """Append `columns` to the traces of `fig` with those names (reads the figure's current data).

    keep_last trims every touched trace to its last `keep_last` points (a window of constant size).
    Live views keep their own buffers instead (see `concat`) and call `replace`, which skips the
    read-back through plotly's property tree.
    """
    by_name = {t.name: t for t in fig.data}
    old = {name: {prop: by_name[name][prop] for prop in props} for name, props in columns.items()}
    replace(fig, concat(old, columns, keep_last=keep_last))


def concat(old: Columns, new: Columns, *, keep_last: int | None = None) -> Columns:
    """old + new, trace by trace and property by property (numpy), trimmed to the last keep_last."""
    out: Columns = {name: dict(props) for name, props in old.items()}
    for name, props in new.items():
        mine = out.setdefault(name, {})
        for prop, add in props.items():
            before = mine.get(prop)
            value = (
                add
                if before is None or len(before) == 0
                else np.concatenate([np.asarray(before, dtype=add.dtype), add])
            )
            mine[prop] = value[-keep_last:] if keep_last is not None else value
    return out


def replace(fig: go.Figure, columns: Columns, layout: dict | None = None) -> None:
    """Set `columns` on the named traces, discarding what they held, and apply `layout` (relayout paths).

    All of it goes to the browser as one Plotly.update: one message, one redraw (a restyle per
    property group plus a relayout cost a redraw each; on a small machine that is ~30 ms apiece).
    """
    index = {t.name: i for i, t in enumerate(fig.data)}
    missing = [name for name in columns if name not in index]
    if missing:
        raise KeyError(f"the figure has no trace named {missing[0]!r}; it has {sorted(index)}")
    names = list(columns)
    props = sorted({prop for cols in columns.values() for prop in cols})
    data = {prop: [columns[n].get(prop, Undefined) for n in names] for prop in props}
    fig.plotly_update(
        restyle_data=data, relayout_data=dict(layout or {}), trace_indexes=[index[n] for n in names]
    )


def redraw(widget: go.Figure, fig: go.Figure) -> None:
    """Make a FigureWidget show another figure (its traces, layout and shapes), in one batch: for
    views whose trace count depends on the data (a run's Gantt, its CDFs)."""
    stale = _removed(widget.layout.to_plotly_json(), fig.layout.to_plotly_json())
    with widget.batch_update():
        widget.data = []
        # The traces first: plotly.js given a subplot layout before its traces draws NaN axis lines
        # (console errors). Then what the new layout lacks is removed (assigning a layout only adds
        # and changes; sent at once, while those values are still set on the Python side); then
        # the new layout.
        widget.add_traces(list(fig.data))
        if stale:
            widget.plotly_relayout(stale)
        widget.layout = fig.layout


def _removed(old: dict, new: dict, prefix: str = "") -> dict:
    """Relayout paths (set to None) of what `old` holds and `new` does not: an earlier figure's
    annotations (a placeholder's hint), shapes, hidden axes."""
    out: dict = {}
    for key, value in old.items():
        path = f"{prefix}{key}"
        if key not in new:
            out[path] = None
        elif isinstance(value, dict) and isinstance(new[key], dict):
            out.update(_removed(value, new[key], path + "."))
    return out


def clear(fig: go.Figure, props: Sequence[str] = ("x", "y")) -> None:
    """Empty the data arrays of every trace (layout and styling stay)."""
    empty = {t.name: {p: np.empty(0) for p in props} for t in fig.data}
    replace(fig, empty)


def figure_html(fig: go.Figure, title: str | None = None) -> str:
    """A standalone HTML page of any figure (plotly.js inlined, ~4.7 MB; opens offline)."""
    out = go.Figure(fig)
    if title:
        out.update_layout(title=title)
    return out.to_html(include_plotlyjs=True, full_html=True)


def _phase_of(step: Step) -> str:
    return "prefill" if step.phase == "prefill" else "decode"


# --- token strip ---------------------------------------------------------------------------------


def _peaks_label(peaks: Any) -> str:
    if peaks is None:
        return ""
    get = peaks.get if isinstance(peaks, dict) else lambda k, d=None: getattr(peaks, k, d)
    bits = [str(b) for b in (get("device", None), get("dtype", None), get("method", None)) if b]
    return ", ".join(bits)
