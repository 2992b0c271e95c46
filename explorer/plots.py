"""Trace / Step / table -> plotly Figure. Pure: no widgets, no model; a saved Trace replays here.

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

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.basedatatypes import Undefined  # in a restyle: "leave this trace's value as it is"
from plotly.subplots import make_subplots

from explorer.trace import Step, Trace

Columns = dict[str, dict[str, np.ndarray]]

PHASE_COLORS = {"prefill": "#d62728", "decode": "#1f77b4", "previous": "#9e9e9e"}
PART_COLORS = {"weights": "#4c72b0", "kv_read": "#dd8452", "kv_write": "#c44e52",
               "activations": "#55a868", "other": "#8c8c8c"}
TRAFFIC_PARTS = ("weights", "kv_read", "kv_write", "activations", "other")
MB = 1e6
# template "none" plus a few explicit styles: a named template is a large object that plotly copies and
# validates into every figure (~45 ms each, on every FigureWidget the dashboard builds).
_AXIS = dict(showgrid=True, gridcolor="#ececec", zeroline=False, linecolor="#bbb", ticks="outside",
             tickcolor="#bbb", automargin=True)
BASE_LAYOUT = dict(template="none", margin=dict(l=60, r=20, t=60, b=40), height=320, font=dict(size=12),
                   paper_bgcolor="white", plot_bgcolor="white", hoverlabel=dict(bgcolor="white"),
                   xaxis=_AXIS, yaxis=_AXIS)


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


# --- small helpers -------------------------------------------------------------------------------


def show_token(text: str) -> str:
    """A token as a label: whitespace made visible (space -> ·, newline -> ⏎, tab -> ⇥)."""
    if text == "":
        return "∅"
    return text.replace(" ", "·").replace("\n", "⏎").replace("\t", "⇥").replace("\r", "␍")


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
            value = add if before is None or len(before) == 0 else np.concatenate([np.asarray(before, dtype=add.dtype), add])
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
    fig.plotly_update(restyle_data=data, relayout_data=dict(layout or {}), trace_indexes=[index[n] for n in names])


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

STRIP_WINDOW = 24
# colour scale, its range and the colour bar's title; entropy uses a fixed 0-5 nats like the text strip
STRIP_SCALES = {"prob": ("RdYlGn", 0.0, 1.0, "p final"), "entropy": ("RdYlGn_r", 0.0, 5.0, "H (nats)")}


def strip_figure(color_by: str = "prob", *, height: int = 150) -> go.Figure:
    """The generated tokens as a row of cells, coloured by probability (or entropy).

    Outlined cell: the token the prefill pass produced; hatched cell: a forced token (chosen by
    the user, not sampled). x is the step index; a cell's customdata is its step index.
    """
    _check_color_by(color_by)
    name, lo, hi, title = STRIP_SCALES[color_by]
    fig = go.Figure(
        data=[go.Bar(name="tokens", x=[], y=[], text=[], customdata=[], hovertext=[],
                     hoverinfo="text", textposition="inside", insidetextanchor="middle", textangle=0,
                     textfont=dict(size=13, color="#111"), width=0.96, marker=dict(color=[]),
                     showlegend=False),
              # carries the colour bar only (the cells get their colours as strings, see strip_colors)
              go.Scatter(name="scale", x=[None, None], y=[None, None], mode="markers", hoverinfo="skip",
                         marker=dict(coloraxis="coloraxis", color=[lo, hi]), showlegend=False)],
        layout=_layout(height=height, margin=dict(l=10, r=10, t=30, b=30),
                    # left-aligned: in a narrow column (JupyterLab) the end is cut, not both ends
                    title=dict(text=_strip_title(color_by), font=dict(size=12), x=0, xanchor="left", xref="paper"),
                    coloraxis=dict(colorscale=name, cmin=lo, cmax=hi, colorbar=dict(title=title, thickness=10)),
                    bargap=0.04, clickmode="event",
                    yaxis=dict(visible=False, range=[0, 1], fixedrange=True),
                    xaxis=dict(title=None, dtick=5, fixedrange=True)),
    )
    return fig


def strip_colors(values: Sequence[float], color_by: str = "prob") -> np.ndarray:
    """Cell colours ('rgb(...)' strings) for probabilities or entropies on the strip's colour scale.

    Mapped here rather than by plotly: bars given numbers make plotly.js warn (console.trace) once
    per cell on every redraw, which costs more than the redraw itself in a browser on a small machine.
    """
    from plotly.colors import sample_colorscale

    name, lo, hi, _ = STRIP_SCALES[color_by]
    where = [min(max((float(v) - lo) / (hi - lo), 0.0), 1.0) if v == v else 0.0 for v in values]
    return _objs(sample_colorscale(name, where) if where else [])


def _check_color_by(color_by: str) -> None:
    if color_by not in ("prob", "entropy"):
        raise ValueError(f"color_by must be 'prob' or 'entropy', got {color_by!r}")


def _strip_title(color_by: str) -> str:
    what = "p final of the chosen token" if color_by == "prob" else "entropy of the final distribution"
    return f"Colour: {what}  ·  outlined: prefill  ·  hatched: forced  ·  click a cell to inspect it"


def strip_columns(steps: Sequence[Step], color_by: str = "prob") -> Columns:
    """One cell per step for strip_figure's 'tokens' trace."""
    _check_color_by(color_by)
    color = [s.prob_final if color_by == "prob" else s.entropy_final for s in steps]
    hover = [f"step {s.index} ({s.phase}{', forced' if s.forced else ''})<br>{show_token(s.token_text)!s} "
             f"id {s.token_id}<br>p raw {s.prob_raw:.3f} · p final {s.prob_final:.3f}<br>"
             f"rank raw {s.rank_raw} · H {s.entropy_final:.2f} nats" for s in steps]
    return {"tokens": {
        "x": _arr((s.index for s in steps), np.float64),
        "y": np.ones(len(steps)),
        "text": _objs(show_token(s.token_text) for s in steps),
        "hovertext": _objs(hover),
        "customdata": _arr((s.index for s in steps), np.float64),
        "marker.color": strip_colors(color, color_by),
        "marker.line.width": _arr(3.0 if s.phase == "prefill" else 0.5 for s in steps),
        "marker.line.color": _objs("#222" if s.phase == "prefill" else "#fff" for s in steps),
        "marker.pattern.shape": _objs("x" if s.forced else "" for s in steps),
    }}


def strip_range(last_index: int, window: int = STRIP_WINDOW) -> list[float]:
    """x-axis range that shows the last `window` cells."""
    return [max(-0.5, last_index - window + 0.5), max(last_index + 0.5, window - 0.5)]


def token_strip(trace: Trace, color_by: str = "prob", window: int | None = None) -> go.Figure:
    """The whole run's token strip (the last `window` tokens when given)."""
    fig = strip_figure(color_by)
    steps = trace.steps[-window:] if window else trace.steps
    extend(fig, strip_columns(steps, color_by))
    if steps:
        fig.update_xaxes(range=strip_range(steps[-1].index, window or len(steps)))
    return fig


# --- next-token distribution ----------------------------------------------------------------------


def distribution_figure(titled: bool = True, *, height: int = 360) -> go.Figure:
    """Three panels for one step: top-n bars (raw vs final), the stage waterfall, the draw on the CDF.

    titled=False: no figure title (the dashboard shows the step's title as HTML above the chart: a
    plotly title that changes every step costs ~12 ms of text layout per redraw in the browser).
    """
    fig = make_subplots(rows=1, cols=3, column_widths=[0.52, 0.22, 0.26], horizontal_spacing=0.07,
                        # short: each title must fit its panel in a narrow column (JupyterLab)
                        subplot_titles=("top-n: raw (grey), final (blue)", "stages: mass kept", "draw vs final CDF"))
    fig.add_trace(go.Bar(name="raw", x=[], y=[], customdata=[], hovertext=[], hoverinfo="text",
                         marker=dict(color="#b0b0b0"), showlegend=False), row=1, col=1)
    fig.add_trace(go.Bar(name="final", x=[], y=[], customdata=[], hovertext=[], hoverinfo="text",
                         marker=dict(color="#1f77b4", line=dict(color="#111", width=[])), showlegend=False),
                  row=1, col=1)
    fig.add_trace(go.Bar(name="stages", x=[], y=[], text=[], textposition="outside", hovertext=[],
                         hoverinfo="text", marker=dict(color="#55a868"), showlegend=False), row=1, col=2)
    fig.add_trace(go.Scatter(name="cdf", x=[], y=[], mode="lines+markers", line=dict(shape="hv", color="#1f77b4"),
                             hovertext=[], hoverinfo="text", showlegend=False), row=1, col=3)
    fig.add_trace(go.Scatter(name="chosen band", x=[], y=[], mode="lines", line=dict(color="#d62728", width=8),
                             hoverinfo="skip", showlegend=False), row=1, col=3)
    fig.add_trace(go.Scatter(name="u", x=[], y=[], mode="lines+text", text=[], textposition="top right",
                             line=dict(color="#d62728", dash="dash"), hoverinfo="skip", showlegend=False),
                  row=1, col=3)
    _style_axes(fig)
    title = dict(text="Next-token distribution", font=dict(size=14), y=0.98, yanchor="top") if titled else None
    fig.update_layout(**_layout(height=height if titled else height - 5, barmode="group", clickmode="event",
                      title=title, margin=dict(l=60, r=20, t=95 if titled else 50, b=60 if titled else 100)))
    fig.update_yaxes(title_text="probability", range=[0, 1], row=1, col=1)
    fig.update_yaxes(title_text="mass kept", range=[0, 1.15], row=1, col=2)
    fig.update_yaxes(title_text="cumulative final p", range=[0, 1.05], row=1, col=3)
    fig.update_xaxes(title_text="rank by final p", row=1, col=3)
    return fig


def distribution_columns(step: Step, top_n: int | None = None) -> Columns:
    """The panels' data for one step (replaces, never appends: the selected step changes)."""
    top = step.top[:top_n] if top_n else step.top
    chosen = [t["id"] == step.token_id for t in top]
    labels = [f"{show_token(t['text'])} ({t['id']})" for t in top]
    x = np.arange(len(top), dtype=np.float64)
    ids = _arr((t["id"] for t in top), np.float64)
    hover = [f"{lab}<br>raw {t['raw']:.4f} · final {t['final']:.4f}" + ("<br><b>chosen</b>" if c else "")
             for lab, t, c in zip(labels, top, chosen)]
    stages = step.stages or []
    cdf = _cdf_columns(step, top)
    return {
        "raw": {"x": x, "y": _arr(t["raw"] for t in top), "customdata": ids, "hovertext": _objs(hover)},
        "final": {"x": x, "y": _arr(t["final"] for t in top), "customdata": ids, "hovertext": _objs(hover),
                  "marker.line.width": _arr(3.0 if c else 0.0 for c in chosen)},
        "stages": {"x": _objs(s["name"].replace("_", " ") for s in stages), "y": _arr(s["mass"] for s in stages),
                   "text": _objs(f"{s['kept']:,}" for s in stages),
                   "hovertext": _objs(f"{s['name']}: kept {s['kept']:,} tokens holding {s['mass']:.3f} of the mass "
                                      "entering the stage" for s in stages)},
        **cdf,
    }


def _cdf_columns(step: Step, top: list[dict]) -> Columns:
    """Tokens sorted by final probability, their running sum, and where the uniform draw fell."""
    ranked = sorted(top, key=lambda t: -t["final"])
    cum = np.cumsum([t["final"] for t in ranked]) if ranked else np.empty(0)
    hover = [f"{show_token(t['text'])}: final {t['final']:.4f}, cumulative {c:.4f}" for t, c in zip(ranked, cum)]
    draw = step.draw or {}
    lo, hi = draw.get("cdf_lo"), draw.get("cdf_hi")
    rank = min(step.rank_final, len(ranked))  # a token beyond the top-n sits just right of them
    beyond = f" · chosen: rank {step.rank_final} (beyond the top {len(ranked)})" if step.rank_final >= len(ranked) else ""
    band_x = np.array([rank, rank], dtype=np.float64) if lo is not None else np.empty(0)
    band_y = np.array([lo, hi], dtype=np.float64) if lo is not None else np.empty(0)
    u = draw.get("u")
    if u is not None:
        u_cols = {"x": np.array([0.0, max(len(ranked), rank, 1)]), "y": np.array([u, u]),
                  "text": _objs([f"u = {u:.3f}{beyond}", ""])}
    else:
        label = "forced: chosen by you" if step.forced else "greedy: argmax (no draw)"
        u_cols = {"x": np.array([0.0]), "y": np.array([1.0]), "text": _objs([label])}
    return {"cdf": {"x": np.arange(len(ranked), dtype=np.float64), "y": cum, "hovertext": _objs(hover)},
            "chosen band": {"x": band_x, "y": band_y},
            "u": u_cols}


def distribution_title(step: Step) -> str:
    """What was chosen at this step, how, and how likely it was."""
    how = "forced" if step.forced else ("greedy" if (step.draw or {}).get("u") is None else "sampled")
    return (f"Step {step.index} ({step.phase}): {show_token(step.token_text)!s} id {step.token_id} {how}, "
            f"p final {step.prob_final:.3f} (rank {step.rank_final}), H {step.entropy_final:.2f} nats")


def distribution_labels(step: Step, top_n: int | None = None, titled: bool = True) -> dict[str, Any]:
    """Layout updates for one step: the bars' token labels (and the title)."""
    top = step.top[:top_n] if top_n else step.top
    labels = {"xaxis.tickvals": list(range(len(top))), "xaxis.ticktext": [show_token(t["text"]) for t in top]}
    return {**labels, "title.text": distribution_title(step)} if titled else labels


def distribution(step: Step, top_n: int | None = None) -> go.Figure:
    """The distribution panels of one step as a standalone figure."""
    fig = distribution_figure()
    replace(fig, distribution_columns(step, top_n))
    fig.update_layout(distribution_labels(step, top_n))
    return fig


# --- latency ---------------------------------------------------------------------------------------


def latency_figure(device: str = "", dtype: str = "", *, height: int = 300) -> go.Figure:
    """Measured forward-pass latency per step, prefill and decode told apart; an earlier run overlaid."""
    where = f" on {device}, {dtype}" if device else ""
    fig = go.Figure(
        data=[go.Scatter(name="earlier run", x=[], y=[], mode="lines", line=dict(color=PHASE_COLORS["previous"]),
                         hovertemplate="step %{x}: %{y:.2f} ms<extra>earlier run</extra>"),
              go.Scatter(name="prefill", x=[], y=[], mode="markers", marker=dict(size=11, symbol="diamond",
                         color=PHASE_COLORS["prefill"]), hovertemplate="prefill: %{y:.2f} ms<extra></extra>"),
              go.Scatter(name="decode", x=[], y=[], mode="lines", line=dict(color=PHASE_COLORS["decode"]),
                         hovertemplate="step %{x}: %{y:.2f} ms<extra>decode</extra>")],
        layout=_layout(height=height,
                    title=dict(text=f"Latency per step (measured{where}: one forward pass each, device-synchronised)",
                               font=dict(size=13)),
                    xaxis=dict(title="step"), yaxis=dict(title="ms", rangemode="tozero"),
                    legend=dict(orientation="h", x=0, y=1.12)),
    )
    return fig


def latency_columns(steps: Sequence[Step]) -> Columns:
    cols: Columns = {}
    for phase in ("prefill", "decode"):
        mine = [s for s in steps if _phase_of(s) == phase]
        if mine:
            cols[phase] = {"x": _arr((s.index for s in mine), np.float64),
                           "y": _arr(s.latency_s * 1e3 for s in mine)}
    return cols


def earlier_run_columns(steps: Sequence[Step], name: str = "earlier run") -> Columns:
    """The 'earlier run' trace (named `name`): a previous run's latencies (e.g. with the cache the other way)."""
    return {name: {"x": _arr((s.index for s in steps), np.float64),
                            "y": _arr(s.latency_s * 1e3 for s in steps)}}


def earlier_run_name(use_cache: bool | None) -> str:
    return "earlier run" if use_cache is None else f"earlier run (cache {'on' if use_cache else 'off'})"


def latency(trace: Trace, earlier: Trace | None = None) -> go.Figure:
    fig = latency_figure(trace.device, trace.dtype)
    extend(fig, latency_columns(trace.steps))
    if earlier is not None:
        fig.data[0].name = earlier_run_name(earlier.settings.get("use_cache"))
        extend(fig, earlier_run_columns(earlier.steps, fig.data[0].name))
    return fig


# --- memory traffic ---------------------------------------------------------------------------------


def traffic_group(part: str) -> str:
    """Which stack a cost-model part belongs to: 'weights/mlp' -> 'weights', 'kv_read' -> 'kv_read'."""
    head = part.split("/", 1)[0]
    return head if head in TRAFFIC_PARTS else "other"


def traffic_figure(peak_gbps: float | None = None, *, label: str = "", height: int = 520) -> go.Figure:
    """Bytes moved per step (modelled, stacked by part), achieved bandwidth vs the measured peak,
    and the KV cache size (measured from the cache tensors)."""
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.08, row_heights=[0.45, 0.3, 0.25],
                        subplot_titles=("bytes moved per step (modelled, by part)",
                                        "achieved bandwidth = modelled bytes / measured latency",
                                        "KV cache held (measured)"))
    for part in TRAFFIC_PARTS:  # stacked areas, not bars: one SVG path per part however many steps
        fig.add_trace(go.Scatter(name=part, x=[], y=[], mode="lines", stackgroup="bytes",
                                 line=dict(color=PART_COLORS[part], width=0.5, shape="hvh"),
                                 hovertemplate=f"step %{{x}}: %{{y:.3f}} MB<extra>{part}</extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(name="achieved GB/s", x=[], y=[], mode="lines",
                             line=dict(color="#333"), hovertemplate="step %{x}: %{y:.2f} GB/s<extra></extra>"),
                  row=2, col=1)
    fig.add_trace(go.Scatter(name="KV cache", x=[], y=[], mode="lines", fill="tozeroy", line=dict(color="#dd8452"),
                             hovertemplate="step %{x}: %{y:.3f} MB<extra>KV cache</extra>"), row=3, col=1)
    _style_axes(fig)
    fig.update_layout(**_layout(height=height,
                      title=dict(text="Memory traffic per step", font=dict(size=14)),
                      legend=dict(orientation="v", x=1.02, y=1, traceorder="normal")))
    fig.update_yaxes(title_text="MB", row=1, col=1)
    fig.update_yaxes(title_text="GB/s", rangemode="tozero", row=2, col=1)
    fig.update_yaxes(title_text="MB", rangemode="tozero", row=3, col=1)
    fig.update_xaxes(title_text="step", row=3, col=1)
    set_peak_bandwidth(fig, peak_gbps, label)
    return fig


def set_peak_bandwidth(fig: go.Figure, peak_gbps: float | None, label: str = "") -> None:
    """Draw (or redraw) the measured peak bandwidth as a dashed line on the bandwidth panel."""
    fig.layout.shapes = ()
    fig.layout.annotations = tuple(a for a in fig.layout.annotations if a.name != "peak")
    if peak_gbps is None or not math.isfinite(peak_gbps):
        return
    fig.add_shape(type="line", xref="x2 domain", x0=0, x1=1, yref="y2", y0=peak_gbps, y1=peak_gbps,
                  line=dict(color="#d62728", dash="dash"))
    fig.add_annotation(name="peak", xref="x2 domain", x=1, xanchor="right", yref="y2", y=peak_gbps,
                       yanchor="bottom", showarrow=False, font=dict(color="#d62728", size=11),
                       text=f"measured peak {peak_gbps:.1f} GB/s{(' (' + label + ')') if label else ''}")
    fig.update_layout({"yaxis2.range": [0, peak_gbps * 1.15]})  # by name: a FigureWidget made from a dict has no grid


def traffic_columns(steps: Sequence[Step]) -> Columns:
    with_bytes = [s for s in steps if s.bytes]
    cols: Columns = {}
    if with_bytes:
        x = _arr((s.index for s in with_bytes), np.float64)
        for part in TRAFFIC_PARTS:
            y = _arr(sum(v for k, v in s.bytes.items() if traffic_group(k) == part) / MB for s in with_bytes)
            cols[part] = {"x": x, "y": y}
        cols["achieved GB/s"] = {"x": x, "y": _arr(_achieved_gbps(s) for s in with_bytes)}
    cols["KV cache"] = {"x": _arr((s.index for s in steps), np.float64), "y": _arr(s.kv_cache_bytes / MB for s in steps)}
    return cols


def _achieved_gbps(step: Step) -> float:
    if step.achieved_gbps is not None:
        return float(step.achieved_gbps)
    if step.bytes and step.latency_s > 0:
        return step.total_bytes / step.latency_s / 1e9
    return float("nan")


def traffic(trace: Trace) -> go.Figure:
    fig = traffic_figure(_peak(trace.hardware, "bandwidth_gbps"), label=_peaks_label(trace.hardware))
    extend(fig, traffic_columns(trace.steps))
    return fig


def _peaks_label(peaks: Any) -> str:
    if peaks is None:
        return ""
    get = peaks.get if isinstance(peaks, dict) else lambda k, d=None: getattr(peaks, k, d)
    bits = [str(b) for b in (get("device", None), get("dtype", None), get("method", None)) if b]
    return ", ".join(bits)


# --- roofline ----------------------------------------------------------------------------------------

AI_RANGE = (1e-2, 1e4)  # FLOP per byte, the x range of the ceilings


def roofline_figure(peaks: Any = None, known_chips: Any = None, *, height: int = 420) -> go.Figure:
    """Each step as a point (arithmetic intensity vs achieved FLOP/s) under the machine's ceilings.

    The measured ceiling is min(peak FLOP/s, intensity x peak bandwidth) from explorer.hardware's
    measurements on this machine; known chips are datasheet numbers (modelled), hidden until
    clicked in the legend.
    """
    fig = go.Figure(
        data=[go.Scatter(name="prefill", x=[], y=[], mode="markers", customdata=[],
                         marker=dict(size=11, symbol="diamond", color=PHASE_COLORS["prefill"]),
                         hovertemplate="step %{customdata}: %{x:.2f} FLOP/B, %{y:.3s}FLOP/s<extra>prefill</extra>"),
              go.Scatter(name="decode", x=[], y=[], mode="markers", customdata=[],
                         marker=dict(size=6, color=PHASE_COLORS["decode"], opacity=0.7),
                         hovertemplate="step %{customdata}: %{x:.2f} FLOP/B, %{y:.3s}FLOP/s<extra>decode</extra>")],
        layout=_layout(height=height,
                    title=dict(text="Roofline: modelled FLOPs and bytes over measured latency", font=dict(size=13)),
                    xaxis=dict(type="log", title="arithmetic intensity (FLOP / byte, modelled)"),
                    yaxis=dict(type="log", title="achieved FLOP/s"),
                    legend=dict(orientation="v", x=1.02, y=1)),
    )
    set_ceilings(fig, peaks, known_chips)
    return fig


def ceiling_line(bandwidth_gbps: float, flops: float, n: int = 60) -> tuple[np.ndarray, np.ndarray]:
    """x = intensity, y = min(flops, x * bandwidth): the roofline of one machine."""
    x = np.logspace(math.log10(AI_RANGE[0]), math.log10(AI_RANGE[1]), n)
    return x, np.minimum(flops, x * bandwidth_gbps * 1e9)


def set_ceilings(fig: go.Figure, peaks: Any, known_chips: Any = None) -> None:
    """Replace the ceiling traces: this machine's (measured), and each known chip's (modelled)."""
    fig.data = tuple(t for t in fig.data if t.name in ("prefill", "decode"))
    bw, fl = _peak(peaks, "bandwidth_gbps"), _peak(peaks, "flops")
    if bw and fl:
        x, y = ceiling_line(bw, fl)
        label = _peaks_label(peaks)
        fig.add_trace(go.Scatter(name=f"this machine (measured{': ' + label if label else ''})", x=x, y=y,
                                 mode="lines", line=dict(color="#111", width=3), hoverinfo="skip"))
    for name, chip in _chips(known_chips):
        x, y = ceiling_line(chip["bandwidth_gbps"], chip["flops"])
        fig.add_trace(go.Scatter(name=f"{name} (modelled: datasheet)", x=x, y=y, mode="lines",
                                 line=dict(dash="dot", width=1.5), visible="legendonly", hoverinfo="skip"))


def _chips(known: Any) -> list[tuple[str, dict]]:
    """Known chips as (name, {"bandwidth_gbps", "flops"}), from a dict of dicts/objects or a list."""
    if not known:
        return []
    items = known.items() if isinstance(known, dict) else [(getattr(c, "name", str(i)), c) for i, c in enumerate(known)]
    out = []
    for name, chip in items:
        bw, fl = _peak(chip, "bandwidth_gbps"), _peak(chip, "flops")
        if bw and fl:
            out.append((str(name), {"bandwidth_gbps": bw, "flops": fl}))
    return out


def roofline_columns(steps: Sequence[Step]) -> Columns:
    cols: Columns = {}
    for phase in ("prefill", "decode"):
        mine = [s for s in steps if _phase_of(s) == phase and s.flops and s.bytes and s.latency_s > 0]
        if mine:
            cols[phase] = {"x": _arr(s.flops / s.total_bytes for s in mine),
                           "y": _arr(s.flops / s.latency_s for s in mine),
                           "customdata": _arr((s.index for s in mine), np.float64)}
    return cols


def roofline(trace: Trace, known_chips: Any = None) -> go.Figure:
    fig = roofline_figure(trace.hardware, known_chips)
    extend(fig, roofline_columns(trace.steps))
    return fig


# --- speculative decoding ------------------------------------------------------------------------------

OUTCOME_COLORS = {"accepted": "#2ca02c", "rejected": "#d62728", "not tested": "#c7c7c7",
                  "resampled": "#ff7f0e", "bonus": "#1f77b4"}
SPEC_ROUNDS_WINDOW = 24


def _field(obj: Any, name: str, default=None):
    """A field of a Round given as an object or as its to_dict() (Trace.rounds holds dicts)."""
    return obj.get(name, default) if isinstance(obj, dict) else getattr(obj, name, default)


def rounds_figure(*, height: int = 380) -> go.Figure:
    """Each round as a row: the k drafted tokens marked accepted / rejected / not tested, then the
    token the target added (resampled from the residual after a rejection, or the bonus)."""
    fig = go.Figure(
        data=[go.Scatter(name=outcome, x=[], y=[], text=[], hovertext=[], hoverinfo="text", mode="markers+text",
                         marker=dict(symbol="square", size=34, color=color), textfont=dict(size=11),
                         textposition="middle center")
              for outcome, color in OUTCOME_COLORS.items()],
        layout=_layout(height=height,
                    title=dict(text="Rounds: drafted tokens and what the target did with them", font=dict(size=13)),
                    xaxis=dict(title="position in the round (drafts, then the target's token)", dtick=1,
                               zeroline=False),
                    yaxis=dict(title="round", autorange="reversed", dtick=1, zeroline=False),
                    legend=dict(orientation="h", x=0, y=1.12)),
    )
    return fig


def rounds_columns(rounds: Sequence[Any]) -> Columns:
    """One cell per drafted token, plus the residual / bonus cell, per round."""
    cells: dict[str, list[tuple[float, float, str, str]]] = {k: [] for k in OUTCOME_COLORS}
    for r in rounds:
        index = _field(r, "index")
        for pos, d in enumerate(_field(r, "drafts", [])):
            outcome = {True: "accepted", False: "rejected", None: "not tested"}[d.get("accepted")]
            hover = (f"round {index}, draft {pos + 1}: {show_token(d['text'])} (id {d['id']})<br>"
                     f"q {d['q']:.3f} · p {d['p']:.3f} · accept prob {d['accept_prob']:.3f}"
                     + (f" · u {d['u']:.3f}" if d.get("u") is not None else "") + f"<br>{outcome}")
            cells[outcome].append((pos, index, show_token(d["text"]), hover))
        residual, bonus = _field(r, "residual"), _field(r, "bonus")
        extra = residual or bonus
        if extra is not None:
            kind = "resampled" if residual is not None else "bonus"
            pos = residual["position"] if residual is not None else len(_field(r, "drafts", []))
            why = (f"resampled from the residual max(0, p - q) (mass {residual['mass']:.3f})" if residual is not None
                   else f"bonus from the target's last distribution (p {bonus['p']:.3f})")
            cells[kind].append((pos, index, show_token(extra["text"]),
                                f"round {index}: {show_token(extra['text'])} (id {extra['id']})<br>{why}"))
    cols: Columns = {}
    for outcome, rows in cells.items():
        if rows:
            cols[outcome] = {"x": _arr((c[0] for c in rows), np.float64), "y": _arr((c[1] for c in rows), np.float64),
                             "text": _objs(c[2] for c in rows), "hovertext": _objs(c[3] for c in rows)}
    return cols


def rounds_range(last_round: int, window: int = SPEC_ROUNDS_WINDOW) -> list[float]:
    """y range (reversed axis) that shows the last `window` rounds."""
    return [last_round + 0.5, max(-0.5, last_round - window + 0.5)]


def alpha_figure(*, height: int = 300) -> go.Figure:
    """Acceptance per round and the running alpha (accepted / tested drafts): measured counts."""
    return go.Figure(
        data=[go.Bar(name="accepted / k this round", x=[], y=[], marker=dict(color="#9ecae1"),
                     hovertemplate="round %{x}: %{y:.2f}<extra></extra>"),
              go.Scatter(name="running alpha (accepted / tested)", x=[], y=[], mode="lines+markers",
                         line=dict(color="#08519c"), hovertemplate="round %{x}: alpha %{y:.3f}<extra></extra>"),
              go.Scatter(name="running alpha from overlap, sum min(p, q)", x=[], y=[], mode="lines",
                         line=dict(color="#fd8d3c", dash="dot"),
                         hovertemplate="round %{x}: %{y:.3f}<extra>overlap</extra>")],
        layout=_layout(height=height, title=dict(text="Acceptance rate alpha", font=dict(size=13)),
                    xaxis=dict(title="round"), yaxis=dict(title="alpha", range=[0, 1.05]),
                    legend=dict(orientation="h", x=0, y=1.15)),
    )


def alpha_columns(rounds: Sequence[Any], before: dict | None = None) -> Columns:
    """Per-round acceptance and running alpha; `before` carries the counts of earlier rounds
    ({"tested", "accepted", "overlap_sum", "overlap_n"}) so appending stays O(new rounds)."""
    acc = dict(before or {"tested": 0, "accepted": 0, "overlap_sum": 0.0, "overlap_n": 0})
    x, frac, run, over = [], [], [], []
    for r in rounds:
        k, n = _field(r, "k"), _field(r, "accepted")
        if not k:
            continue
        tested = n + (1 if n < k else 0)
        acc["tested"] += tested
        acc["accepted"] += n
        for d in _field(r, "drafts", [])[:tested]:
            acc["overlap_sum"] += d["overlap"]
            acc["overlap_n"] += 1
        x.append(_field(r, "index"))
        frac.append(n / k)
        run.append(acc["accepted"] / acc["tested"])
        over.append(acc["overlap_sum"] / acc["overlap_n"] if acc["overlap_n"] else float("nan"))
    if before is not None:
        before.update(acc)
    if not x:
        return {}
    xs = _arr(x, np.float64)
    return {"accepted / k this round": {"x": xs, "y": _arr(frac)},
            "running alpha (accepted / tested)": {"x": xs, "y": _arr(run)},
            "running alpha from overlap, sum min(p, q)": {"x": xs, "y": _arr(over)}}


def accepted_histogram_figure(*, height: int = 300) -> go.Figure:
    return go.Figure(
        data=[go.Bar(name="rounds", x=[], y=[], marker=dict(color="#2ca02c"),
                     hovertemplate="%{x} accepted: %{y} rounds<extra></extra>")],
        layout=_layout(height=height,
                    title=dict(text="Accepted drafts per round (measured counts)", font=dict(size=13)),
                    xaxis=dict(title="draft tokens accepted", dtick=1), yaxis=dict(title="rounds")))


def accepted_histogram_columns(histogram: Sequence[int]) -> Columns:
    return {"rounds": {"x": np.arange(len(histogram), dtype=np.float64), "y": _arr(histogram, np.float64)}}


def speedup_figure(rows: Sequence[dict] = (), *, height: int = 340) -> go.Figure:
    """Predicted (Leviathan et al. eq. 1, from measured alpha and c) vs measured speedup, per k."""
    fig = go.Figure(
        data=[go.Bar(name="predicted (modelled: eq. 1, verify = 1 decode pass)", x=[], y=[],
                     marker=dict(color="#9ecae1")),
              go.Bar(name="predicted with measured verify cost (modelled)", x=[], y=[], marker=dict(color="#4292c6")),
              go.Bar(name="measured (forward passes)", x=[], y=[], marker=dict(color="#d62728"))],
        layout=_layout(height=height, barmode="group",
                    title=dict(text="Speedup over target-only decoding, per k", font=dict(size=13)),
                    xaxis=dict(title="k (draft tokens per round)", dtick=1), yaxis=dict(title="speedup (x)"),
                    legend=dict(orientation="h", x=0, y=1.18)),
    )
    fig.add_hline(y=1, line=dict(color="#555", dash="dash"))
    if rows:
        replace(fig, speedup_columns(rows))
    return fig


def speedup_columns(rows: Sequence[dict]) -> Columns:
    ks = _arr((r["k"] for r in rows), np.float64)
    return {"predicted (modelled: eq. 1, verify = 1 decode pass)": {"x": ks, "y": _arr(_num(r.get("predicted")) for r in rows)},
            "predicted with measured verify cost (modelled)":
                {"x": ks, "y": _arr(_num(r.get("predicted_with_verify_cost")) for r in rows)},
            "measured (forward passes)": {"x": ks, "y": _arr(_num(r.get("measured")) for r in rows)}}


def speculative_rounds(trace: Trace) -> go.Figure:
    """A speculative Trace's rounds as one figure (for notebooks)."""
    fig = rounds_figure()
    extend(fig, rounds_columns(trace.rounds))
    return fig


# --- sweeps (explorer.experiments DataFrames) ------------------------------------------------------------

SWEEPS = ("cache", "prefill", "batch", "dtype")
_MEASURED, _MODELLED = dict(mode="lines+markers"), dict(mode="lines", line=dict(dash="dot"))


def _col(df, name: str, scale: float = 1.0) -> np.ndarray:
    """A DataFrame column as float numpy (NaN where missing or absent), times scale."""
    if df is None or name not in df:
        return np.full(0 if df is None else len(df), np.nan)
    return df[name].astype(float).to_numpy() * scale


def sweep_figure(kind: str, *, height: int = 420) -> go.Figure:
    """The empty chart of one sweep: measured lines solid, modelled (roofline bound) lines dotted."""
    builders = {"cache": _cache_sweep_figure, "prefill": _prefill_sweep_figure, "batch": _batch_sweep_figure,
                "dtype": _dtype_sweep_figure}
    if kind not in builders:
        raise ValueError(f"unknown sweep {kind!r}; use one of {', '.join(SWEEPS)}")
    fig = builders[kind]()
    _style_axes(fig)
    fig.update_layout(height=height, template="none", paper_bgcolor="white", plot_bgcolor="white",
                      margin=dict(l=60, r=20, t=70, b=40), legend=dict(orientation="h", x=0, y=-0.18),
                      font=dict(size=12))
    return fig


def _two_panels(titles: tuple[str, str], title: str) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=titles, horizontal_spacing=0.1)
    fig.update_layout(title=dict(text=title, font=dict(size=13)))
    return fig


def _add(fig: go.Figure, col: int, name: str, color: str, style: dict, kind: str = "scatter") -> None:
    if kind == "bar":
        fig.add_trace(go.Bar(name=name, x=[], y=[], marker=dict(color=color)), row=1, col=col)
    else:
        fig.add_trace(go.Scatter(name=name, x=[], y=[], marker=dict(color=color, size=5),
                                 **{**style, "line": {**style.get("line", {}), "color": color}}), row=1, col=col)


def _cache_sweep_figure() -> go.Figure:
    fig = _two_panels(("latency per step", "cumulative time"), "KV cache on vs off: the same greedy generation")
    for mode, color in (("cache on", "#1f77b4"), ("cache off", "#d62728")):
        _add(fig, 1, f"{mode}: per step (measured)", color, _MEASURED)
        _add(fig, 2, f"{mode}: cumulative (measured)", color, _MEASURED)
        _add(fig, 2, f"{mode}: cumulative bound (modelled)", color, _MODELLED)
    fig.update_xaxes(title_text="step (0 = prefill)")
    fig.update_yaxes(title_text="ms", row=1, col=1)
    fig.update_yaxes(title_text="s", row=1, col=2)
    return fig


def _prefill_sweep_figure() -> go.Figure:
    fig = _two_panels(("latency of one pass", "tokens per second"), "Prefill vs decode by context length")
    _add(fig, 1, "prefill (measured)", "#d62728", _MEASURED)
    _add(fig, 1, "prefill bound (modelled)", "#d62728", _MODELLED)
    _add(fig, 1, "decode (measured)", "#1f77b4", _MEASURED)
    _add(fig, 1, "decode bound (modelled)", "#1f77b4", _MODELLED)
    _add(fig, 2, "prefill tokens/s (measured)", "#d62728", _MEASURED)
    _add(fig, 2, "decode tokens/s (measured)", "#1f77b4", _MEASURED)
    fig.update_xaxes(title_text="context length (tokens)", type="log")
    fig.update_yaxes(title_text="ms", type="log", row=1, col=1)
    fig.update_yaxes(title_text="tokens/s", type="log", row=1, col=2)
    return fig


def _batch_sweep_figure() -> go.Figure:
    fig = _two_panels(("tokens per second", "decode step latency"), "Batch size: one decode pass for B rows")
    _add(fig, 1, "total (measured)", "#2ca02c", _MEASURED)
    _add(fig, 1, "total, roofline best (modelled)", "#2ca02c", _MODELLED)
    _add(fig, 1, "per user (measured)", "#9467bd", _MEASURED)
    _add(fig, 2, "step latency (measured)", "#1f77b4", _MEASURED)
    _add(fig, 2, "bound (modelled)", "#1f77b4", _MODELLED)
    fig.update_xaxes(title_text="batch size", type="log")
    fig.update_yaxes(title_text="tokens/s", type="log", row=1, col=1)
    fig.update_yaxes(title_text="ms", row=1, col=2, rangemode="tozero")
    return fig


def _dtype_sweep_figure() -> go.Figure:
    fig = _two_panels(("decode step latency", "bytes held"), "dtype: the same model in each number format")
    _add(fig, 1, "latency (measured)", "#1f77b4", {}, "bar")
    _add(fig, 1, "bound (modelled)", "#aec7e8", {}, "bar")
    _add(fig, 2, "weights MB (counted)", "#4c72b0", {}, "bar")
    _add(fig, 2, "KV cache MB (measured)", "#dd8452", {}, "bar")
    fig.update_layout(barmode="group")
    fig.update_yaxes(title_text="ms", row=1, col=1)
    fig.update_yaxes(title_text="MB", row=1, col=2)
    return fig


def sweep_columns(kind: str, df) -> Columns:
    """The columns of sweep_figure(kind)'s traces from an explorer.experiments DataFrame."""
    if kind == "cache":
        cols: Columns = {}
        for mode in ("cache on", "cache off"):
            part = df[df["mode"] == mode] if len(df) else df
            x = _col(part, "step")
            cols[f"{mode}: per step (measured)"] = {"x": x, "y": _col(part, "latency_s_measured", 1e3)}
            cols[f"{mode}: cumulative (measured)"] = {"x": x, "y": _col(part, "cumulative_s_measured")}
            cols[f"{mode}: cumulative bound (modelled)"] = {"x": x, "y": _col(part, "cumulative_bound_s_modelled")}
        return cols
    if kind == "prefill":
        cols = {}
        for phase in ("prefill", "decode"):
            part = df[df["phase"] == phase] if len(df) else df
            x = _col(part, "context_len")
            cols[f"{phase} (measured)"] = {"x": x, "y": _col(part, "latency_s_measured", 1e3)}
            cols[f"{phase} bound (modelled)"] = {"x": x, "y": _col(part, "bound_s_modelled", 1e3)}
            cols[f"{phase} tokens/s (measured)"] = {"x": x, "y": _col(part, "tokens_per_s_measured")}
        return cols
    if kind == "batch":
        x = _col(df, "batch")
        return {"total (measured)": {"x": x, "y": _col(df, "tokens_per_s_total_measured")},
                "total, roofline best (modelled)": {"x": x, "y": _col(df, "tokens_per_s_total_bound_modelled")},
                "per user (measured)": {"x": x, "y": _col(df, "tokens_per_s_per_user_measured")},
                "step latency (measured)": {"x": x, "y": _col(df, "latency_s_measured", 1e3)},
                "bound (modelled)": {"x": x, "y": _col(df, "bound_s_modelled", 1e3)}}
    if kind == "dtype":
        x = _objs(df["dtype"]) if len(df) else _objs([])
        return {"latency (measured)": {"x": x, "y": _col(df, "latency_s_measured", 1e3)},
                "bound (modelled)": {"x": x, "y": _col(df, "bound_s_modelled", 1e3)},
                "weights MB (counted)": {"x": x, "y": _col(df, "weight_bytes_counted", 1 / MB)},
                "KV cache MB (measured)": {"x": x, "y": _col(df, "kv_cache_bytes_measured", 1 / MB)}}
    raise ValueError(f"unknown sweep {kind!r}; use one of {', '.join(SWEEPS)}")


def sweep_shapes(kind: str, df) -> dict[str, Any]:
    """Layout extras: the batch sweep's roofline knee as a vertical line (modelled)."""
    knee = (df.attrs or {}).get("knee_batch_modelled") if kind == "batch" else None
    if not knee:
        return {"shapes": []}
    return {"shapes": [dict(type="line", xref="x", x0=knee, x1=knee, yref="y domain", y0=0, y1=1,
                            line=dict(color="#555", dash="dash"))],
            "title.text": f"Batch size: one decode pass for B rows · knee at B = {knee} (modelled: roofline)"}


def sweep(kind: str, df) -> go.Figure:
    """A whole sweep as one figure (for notebooks)."""
    fig = sweep_figure(kind)
    replace(fig, sweep_columns(kind, df))
    extras = sweep_shapes(kind, df)
    fig.update_layout(shapes=extras["shapes"])
    if "title.text" in extras:
        fig.update_layout(title_text=extras["title.text"])
    return fig
