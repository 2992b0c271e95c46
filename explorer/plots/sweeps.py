"""The charts of the registered sweeps (explorer.sweeps): one SweepPlot per sweep name.

    sweep_figure(name)         -> the empty chart (measured lines solid, modelled lines dotted)
    sweep_columns(name, df)    -> its traces' columns from the sweep's DataFrame
    sweep_shapes(name, df)     -> layout extras (the batch knee)
    sweep(name, df)            -> the whole figure, for notebooks

A new sweep adds its chart here with @sweep_plot("its name").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from explorer._registry import Registry
from explorer.plots.common import MB, NOISY_COLOR, Columns, _house_style, _objs, log_ticks, replace

_MEASURED, _MODELLED = dict(mode="lines+markers"), dict(mode="lines", line=dict(dash="dot"))


@dataclass(frozen=True)
class SweepPlot:
    figure: Callable[[], go.Figure]
    columns: Callable[[Any], Columns]
    shapes: Callable[[Any], dict[str, Any]] | None = None


SWEEP_PLOTS: Registry[SweepPlot] = Registry("sweep chart")


def sweep_plot(name: str, columns: Callable[[Any], Columns], shapes=None):
    """Register the decorated figure builder (and its columns) as the chart of sweep `name`."""

    def register(figure: Callable[[], go.Figure]):
        SWEEP_PLOTS.add(name, SweepPlot(figure, columns, shapes))
        return figure

    return register


def _plot(name: str) -> SweepPlot:
    return SWEEP_PLOTS.get(name)


def _col(df, name: str, scale: float = 1.0) -> np.ndarray:
    """A DataFrame column as float numpy (NaN where missing or absent), times scale."""
    if df is None or name not in df:
        return np.full(0 if df is None else len(df), np.nan)
    return df[name].astype(float).to_numpy() * scale


def _marks(part) -> dict:
    """The badge of each measured point: an orange ring where its row's timing is noisy
    (the sweep's `noisy` column, explorer.costs.noise); nothing for frames without one."""
    if part is None or "noisy" not in part or not len(part):
        return {}
    noisy = part["noisy"].fillna(False).astype(bool).to_numpy()
    return {
        "marker.line.width": np.where(noisy, 2.0, 0.0),
        "marker.line.color": _objs(NOISY_COLOR if n else "rgba(0,0,0,0)" for n in noisy),
    }


def sweep_figure(name: str, *, height: int = 420) -> go.Figure:
    """The empty chart of one sweep: measured lines solid, modelled (roofline bound) lines dotted."""
    # the legend at the bottom of the figure (container), below the axis titles: placed under
    # the plot area (y=-0.18) it covered them
    fig = _house_style(
        _plot(name).figure(),
        height=height,
        legend=dict(orientation="h", x=0, y=0, yref="container", yanchor="bottom"),
        margin=dict(l=60, r=20, t=70, b=115),
    )
    return log_ticks(fig)


def sweep_columns(name: str, df) -> Columns:
    """The columns of sweep_figure(name)'s traces from an explorer.sweeps DataFrame."""
    return _plot(name).columns(df)


def sweep_shapes(name: str, df) -> dict[str, Any]:
    """Layout extras: {"shapes": [...]} and maybe "title.text"."""
    shapes = _plot(name).shapes
    return shapes(df) if shapes else {"shapes": []}


def sweep(name: str, df) -> go.Figure:
    """A whole sweep as one figure (for notebooks)."""
    fig = sweep_figure(name)
    replace(fig, sweep_columns(name, df))
    extras = sweep_shapes(name, df)
    fig.update_layout(shapes=extras["shapes"])
    if "title.text" in extras:
        fig.update_layout(title_text=extras["title.text"])
    return fig


def _two_panels(titles: tuple[str, str], title: str) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=titles, horizontal_spacing=0.1)
    fig.update_layout(title=dict(text=title, font=dict(size=13)))
    return fig


def _add(
    fig: go.Figure, col: int, name: str, color: str, style: dict, kind: str = "scatter"
) -> None:
    if kind == "bar":
        fig.add_trace(go.Bar(name=name, x=[], y=[], marker=dict(color=color)), row=1, col=col)
    else:
        fig.add_trace(
            go.Scatter(
                name=name,
                x=[],
                y=[],
                marker=dict(color=color, size=5),
                **{**style, "line": {**style.get("line", {}), "color": color}},
            ),
            row=1,
            col=col,
        )


# --- KV cache on/off ---------------------------------------------------------------------------------


def _cache_columns(df) -> Columns:
    cols: Columns = {}
    for mode in ("cache on", "cache off"):
        part = df[df["mode"] == mode] if len(df) else df
        x = _col(part, "step")
        cols[f"{mode}: per step (measured)"] = {
            "x": x,
            "y": _col(part, "latency_s_measured", 1e3),
            **_marks(part),
        }
        cols[f"{mode}: cumulative (measured)"] = {"x": x, "y": _col(part, "cumulative_s_measured")}
        cols[f"{mode}: cumulative bound (modelled)"] = {
            "x": x,
            "y": _col(part, "cumulative_bound_s_modelled"),
        }
    return cols


@sweep_plot("cache", _cache_columns)
def _cache_sweep_figure() -> go.Figure:
    fig = _two_panels(
        ("latency per step", "cumulative time"), "KV cache on vs off: the same greedy generation"
    )
    for mode, color in (("cache on", "#1f77b4"), ("cache off", "#d62728")):
        _add(fig, 1, f"{mode}: per step (measured)", color, _MEASURED)
        _add(fig, 2, f"{mode}: cumulative (measured)", color, _MEASURED)
        _add(fig, 2, f"{mode}: cumulative bound (modelled)", color, _MODELLED)
    fig.update_xaxes(title_text="step (0 = prefill)")
    fig.update_yaxes(title_text="ms", row=1, col=1)
    fig.update_yaxes(title_text="s", row=1, col=2)
    return fig


# --- prefill vs decode ------------------------------------------------------------------------------


def _prefill_columns(df) -> Columns:
    cols: Columns = {}
    for phase in ("prefill", "decode"):
        part = df[df["phase"] == phase] if len(df) else df
        x = _col(part, "context_len")
        cols[f"{phase} (measured)"] = {
            "x": x,
            "y": _col(part, "latency_s_measured", 1e3),
            **_marks(part),
        }
        cols[f"{phase} bound (modelled)"] = {"x": x, "y": _col(part, "bound_s_modelled", 1e3)}
        cols[f"{phase} tokens/s (measured)"] = {"x": x, "y": _col(part, "tokens_per_s_measured")}
    return cols


@sweep_plot("prefill", _prefill_columns)
def _prefill_sweep_figure() -> go.Figure:
    fig = _two_panels(
        ("latency of one pass", "tokens per second"), "Prefill vs decode by context length"
    )
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


# --- batch size ------------------------------------------------------------------------------------


def _batch_columns(df) -> Columns:
    x = _col(df, "batch")
    return {
        "total (measured)": {"x": x, "y": _col(df, "tokens_per_s_total_measured")},
        "total, roofline best (modelled)": {
            "x": x,
            "y": _col(df, "tokens_per_s_total_bound_modelled"),
        },
        "per user (measured)": {"x": x, "y": _col(df, "tokens_per_s_per_user_measured")},
        "step latency (measured)": {
            "x": x,
            "y": _col(df, "latency_s_measured", 1e3),
            **_marks(df),
        },
        "bound (modelled)": {"x": x, "y": _col(df, "bound_s_modelled", 1e3)},
        "calibrated (modelled: fitted)": {"x": x, "y": _col(df, "latency_s_calibrated", 1e3)},
    }


def _batch_shapes(df) -> dict[str, Any]:
    """The roofline knee as a vertical line (modelled)."""
    knee = (df.attrs or {}).get("knee_batch_modelled")
    if not knee:
        return {"shapes": []}
    return {
        "shapes": [
            dict(
                type="line",
                xref="x",
                x0=knee,
                x1=knee,
                yref="y domain",
                y0=0,
                y1=1,
                line=dict(color="#555", dash="dash"),
            )
        ],
        "title.text": f"Batch size: one decode pass for B rows · knee at B = {knee} (modelled: roofline)",
    }


@sweep_plot("batch", _batch_columns, _batch_shapes)
def _batch_sweep_figure() -> go.Figure:
    fig = _two_panels(
        ("tokens per second", "decode step latency"), "Batch size: one decode pass for B rows"
    )
    _add(fig, 1, "total (measured)", "#2ca02c", _MEASURED)
    _add(fig, 1, "total, roofline best (modelled)", "#2ca02c", _MODELLED)
    _add(fig, 1, "per user (measured)", "#9467bd", _MEASURED)
    _add(fig, 2, "step latency (measured)", "#1f77b4", _MEASURED)
    _add(fig, 2, "bound (modelled)", "#1f77b4", _MODELLED)
    _add(fig, 2, "calibrated (modelled: fitted)", "#937860", _MODELLED)
    fig.update_xaxes(title_text="batch size", type="log")
    fig.update_yaxes(title_text="tokens/s", type="log", row=1, col=1)
    fig.update_yaxes(title_text="ms", row=1, col=2, rangemode="tozero")
    return fig


# --- dtype -----------------------------------------------------------------------------------------


def _dtype_columns(df) -> Columns:
    x = _objs(df["dtype"]) if len(df) else _objs([])
    return {
        "latency (measured)": {"x": x, "y": _col(df, "latency_s_measured", 1e3), **_marks(df)},
        "bound (modelled)": {"x": x, "y": _col(df, "bound_s_modelled", 1e3)},
        "weights MB (counted)": {"x": x, "y": _col(df, "weight_bytes_counted", 1 / MB)},
        "KV cache MB (measured)": {"x": x, "y": _col(df, "kv_cache_bytes_measured", 1 / MB)},
    }


@sweep_plot("dtype", _dtype_columns)
def _dtype_sweep_figure() -> go.Figure:
    fig = _two_panels(
        ("decode step latency", "bytes held"), "dtype: the same model in each number format"
    )
    _add(fig, 1, "latency (measured)", "#1f77b4", {}, "bar")
    _add(fig, 1, "bound (modelled)", "#aec7e8", {}, "bar")
    _add(fig, 2, "weights MB (counted)", "#4c72b0", {}, "bar")
    _add(fig, 2, "KV cache MB (measured)", "#dd8452", {}, "bar")
    fig.update_layout(barmode="group")
    fig.update_yaxes(title_text="ms", row=1, col=1)
    fig.update_yaxes(title_text="MB", row=1, col=2)
    return fig


# --- regime map: batch x context -------------------------------------------------------------------

REGIME_COLORS = {"memory": "#4c72b0", "compute": "#c44e52", "overhead": "#937860"}


def _regime_columns(df) -> Columns:
    cols: Columns = {}
    for reg in REGIME_COLORS:
        part = df[df["regime_derived"] == reg] if len(df) else df
        mbu = _col(part, "mbu_derived")
        text = _objs(f"{m:.2f}" if m == m else "" for m in mbu)
        hover = _objs(
            f"B={int(b)}, context {int(c)}: {lat * 1e3:.3g} ms measured, bound {bd * 1e3:.3g} ms, "
            f"MBU {m:.2f}, {t:.0f} tok/s"
            for b, c, lat, bd, m, t in zip(
                _col(part, "batch"),
                _col(part, "context_len"),
                _col(part, "latency_s_measured"),
                _col(part, "bound_s_modelled"),
                mbu,
                _col(part, "tokens_per_s_total_measured"),
            )
        )
        cols[f"{reg}-bound (measured)"] = {
            "x": _col(part, "context_len"),
            "y": _col(part, "batch"),
            "text": text,
            "hovertext": hover,
            **_marks(part),
        }
    a = getattr(df, "attrs", None) or {}
    contexts = np.unique(_col(df, "context_len")) if len(df) else np.empty(0)
    eq = a.get("kv_equals_weights_tokens")
    kv_line = eq / np.maximum(contexts - 1, 1) if eq else np.full(len(contexts), np.nan)
    top = 16 * np.nanmax(_col(df, "batch")) if len(df) else np.nan
    kv_line[kv_line > top] = np.nan  # far off the map: 16x beyond the largest batch measured
    cols["KV bytes = weight bytes (modelled)"] = {"x": contexts, "y": kv_line}
    crit = {int(k): v for k, v in (a.get("critical_batch_by_context") or {}).items()}
    cols["critical batch (modelled: roofline knee)"] = {
        "x": contexts,
        "y": np.array([crit.get(int(c)) or np.nan for c in contexts], dtype=float),
    }
    cols["tokens/s (measured)"] = {
        "x": _col(df, "batch"),
        "y": _col(df, "tokens_per_s_total_measured"),
        "marker.color": np.log2(np.maximum(_col(df, "context_len"), 1)),
        "hovertext": _objs(
            f"B={int(b)}, context {int(c)}"
            for b, c in zip(_col(df, "batch"), _col(df, "context_len"))
        ),
    }
    return cols


def _regime_shapes(df) -> dict[str, Any]:
    a = getattr(df, "attrs", None) or {}
    floor = a.get("overhead_floor_s")
    if floor is None:
        return {"shapes": []}
    return {
        "shapes": [],
        "title.text": (
            f"Regime map of {a.get('model', '')}: each cell's regime (MBU in the cell) · overhead floor "
            f"{floor * 1e3:.2g} ms (measured skeleton) · boundaries modelled"
        ),
    }


@sweep_plot("regime-map", _regime_columns, _regime_shapes)
def _regime_sweep_figure() -> go.Figure:
    fig = _two_panels(
        ("regime by cell (text: MBU)", "total tokens/s (colour: log2 context)"),
        "Regime map: decode over batch x context",
    )
    for reg, color in REGIME_COLORS.items():
        fig.add_trace(
            go.Scatter(
                name=f"{reg}-bound (measured)",
                x=[],
                y=[],
                mode="markers+text",
                text=[],
                hovertext=[],
                hoverinfo="text",
                textposition="middle center",
                textfont=dict(color="white", size=10),
                marker=dict(symbol="square", size=34, color=color),
            ),
            row=1,
            col=1,
        )
    _add(fig, 1, "KV bytes = weight bytes (modelled)", "#dd8452", _MODELLED)
    _add(fig, 1, "critical batch (modelled: roofline knee)", "#111", _MODELLED)
    fig.add_trace(
        go.Scatter(
            name="tokens/s (measured)",
            x=[],
            y=[],
            mode="markers",
            hovertext=[],
            marker=dict(
                size=9,
                color=[],
                colorscale="Viridis",
                showscale=True,
                colorbar=dict(title=dict(text="log2<br>context", side="top"), len=0.8, x=1.02),
            ),
        ),
        row=1,
        col=2,
    )
    fig.update_xaxes(title_text="context length (tokens)", type="log", row=1, col=1)
    fig.update_yaxes(title_text="batch size", type="log", row=1, col=1)
    fig.update_xaxes(title_text="batch size", type="log", row=1, col=2)
    fig.update_yaxes(title_text="tokens/s", type="log", row=1, col=2)
    return fig


# --- the optimisation ladder -------------------------------------------------------------------------


def _ladder_labels(df) -> list[str]:
    """ "static+compile B=8"; a skipped rung says so in its label (its bars stay empty)."""
    out = []
    for rung, batch, skipped in zip(df["rung"], df["batch"], df["skipped"]):
        label = f"{rung} B={batch}"
        out.append(label + " (skipped)" if isinstance(skipped, str) else label)
    return out


def _ladder_columns(df) -> Columns:
    x = _objs(_ladder_labels(df) if len(df) else [])
    ms = _col(df, "ms_per_token")
    floor = _col(df, "bytes_per_step") / (df.attrs.get("copy_gbps", np.nan) * 1e9) * 1e3
    ppl = _col(df, "perplexity")
    base = ppl[0] if len(ppl) else np.nan  # the first row is the eager baseline
    return {
        "ms/token (measured)": {"x": x, "y": ms, **_marks(df)},
        "bytes / copy bandwidth (modelled)": {"x": x, "y": floor},
        "% of copy bandwidth (derived)": {"x": x, "y": _col(df, "pct_of_copy_bw")},
        "perplexity change % (measured)": {"x": x, "y": 100 * (ppl / base - 1)},
    }


@sweep_plot("ladder", _ladder_columns)
def _ladder_sweep_figure() -> go.Figure:
    fig = make_subplots(
        rows=1,
        cols=3,
        subplot_titles=("decode time per token", "share of copy bandwidth", "quality: perplexity"),
        horizontal_spacing=0.07,
    )
    fig.update_layout(
        title=dict(text="the optimisation ladder: each rung on the same prompt", font=dict(size=13))
    )
    _add(fig, 1, "ms/token (measured)", "#1f77b4", {}, "bar")
    _add(fig, 1, "bytes / copy bandwidth (modelled)", "#aec7e8", {}, "bar")
    _add(fig, 2, "% of copy bandwidth (derived)", "#55a868", {}, "bar")
    _add(fig, 3, "perplexity change % (measured)", "#c44e52", {}, "bar")
    fig.update_layout(barmode="group")
    fig.update_yaxes(title_text="ms", row=1, col=1)
    fig.update_yaxes(title_text="%", row=1, col=2)
    fig.update_yaxes(title_text="% vs eager", row=1, col=3)
    return fig
