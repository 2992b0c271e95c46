"""Where does a trick pay? The charts of the "pays" sweep (explorer.sweeps.pays).

    pays_chart(df)          one trick over one setting: its speedup (measured, solid; predicted by
                            the cost model, dotted), the 1x line, the crossovers (measured and
                            predicted) marked, the background shaded by the baseline's regime, and
                            one line of why per region under the plot
    pays_why_lines(df)      those lines, as text (the dashboard shows them under its chart)
    pays_atlas(frames)      every trick side by side: trick x setting, green where it pays, red
                            where it costs (the cell's text: the measured speedup)

A pays frame has one row per setting: trick, axis, value, baseline_s, trick_s, speedup,
predicted_speedup, regime (of the baseline step: memory | compute | overhead, explorer.costs.split),
how ("measured" or "modelled from measured parts") and why (one line from the split); df.attrs
holds crossover_measured / crossover_predicted (the setting where the speedup crosses 1, or None).
A row whose speedup is missing (a setting past saturation, a trick this device cannot run) is not
drawn as a point: it is marked on the 1x line and its why says what happened.
The registered chart (@sweep_plot("pays"), for the Sweeps tab) is the same figure without the why
block: its regions carry their why as hover text.
"""

from __future__ import annotations

import math
import textwrap
from typing import Any

import numpy as np
import plotly.graph_objects as go

from explorer.plots.common import LOG_AXIS, NOISY_COLOR, _house_style, _objs, replace
from explorer.plots.sweeps import REGIME_COLORS, sweep_plot

PAYS_COLOR, COSTS_COLOR = "#2ca02c", "#d62728"
_SPEEDUP_TICKS = [m * 10.0**e for e in range(-3, 4) for m in (1, 2, 5)]  # 1-2-5 on a log axis
_BAND_Y = 0.965  # where the regions' labels sit, as a share of the plot's height
_LINE_PX = 17  # one why line under the plot
WHY_WIDTH = 150  # characters per line of the why block (an annotation does not wrap by itself)


# --- reading a pays frame ------------------------------------------------------------------------


def _numeric(values) -> bool:
    return len(values) > 0 and all(
        isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
        for v in values
    )


def pays_x_kind(values) -> str:
    """'log' for positive numbers spanning a factor of 8 or more, 'linear' for other numbers,
    'category' for names (fixed / lognormal, model names)."""
    values = [v for v in values if v is not None]
    if not _numeric(values):
        return "category"
    lo, hi = min(values), max(values)
    return "log" if lo > 0 and hi / lo >= 8 else "linear"


def _rows(df) -> list[dict]:
    return [] if df is None or not len(df) else df.to_dict("records")


def _num(v) -> float:
    try:
        out = float(v)
    except (TypeError, ValueError):
        return math.nan
    return out


def _unstable(row: dict) -> bool:
    """A row the sweep skipped (a setting past saturation, a trick this device cannot run) or
    marked unsteady: its speedup is not a steady-state figure, or not there at all."""
    return (
        row.get("steady") is False
        or bool(_said(row.get("skipped")))
        or _num(row["speedup"]) != _num(row["speedup"])
    )


def _said(value) -> str:
    """A text field of a row ("" for None, or NaN as pandas fills a missing text)."""
    return "" if value is None or (isinstance(value, float) and value != value) else str(value)


def _positions(rows: list[dict], kind: str) -> list[float]:
    """Where each row sits on the x axis (its index on a category axis)."""
    return [float(i) if kind == "category" else float(r["value"]) for i, r in enumerate(rows)]


def _edges(xs: list[float], kind: str) -> list[float]:
    """Boundaries between neighbouring settings (midway; geometric on a log axis), the outer ones
    half a step beyond the ends: len(xs) + 1 edges."""
    if not xs:
        return []
    t = [math.log10(x) for x in xs] if kind == "log" else list(xs)
    if len(t) == 1:
        mids, pad = [], 0.5 if kind != "log" else 0.15
        out = [t[0] - pad, t[0] + pad]
    else:
        mids = [(a + b) / 2 for a, b in zip(t, t[1:])]
        out = [t[0] - (t[1] - t[0]) / 2, *mids, t[-1] + (t[-1] - t[-2]) / 2]
    return [10**e for e in out] if kind == "log" else out


def pays_regions(df) -> list[dict]:
    """Runs of neighbouring settings whose baseline shares a regime: {regime, x0, x1, first,
    last, why} (x0/x1 in axis coordinates; why: the row in the middle of the run)."""
    rows = _rows(df)
    kind = pays_x_kind([r["value"] for r in rows])
    edges = _edges(_positions(rows, kind), kind)
    out: list[dict] = []
    for i, r in enumerate(rows):
        reg = _said(r.get("regime")) or None
        if out and out[-1]["regime"] == reg:
            out[-1].update(x1=edges[i + 1], last=r["value"], rows=out[-1]["rows"] + [r])
        else:
            out.append(
                dict(regime=reg, x0=edges[i], x1=edges[i + 1], first=r["value"], last=r["value"],
                     rows=[r])
            )  # fmt: skip
    for reg in out:
        members = reg.pop("rows")
        reg["why"] = _said(members[len(members) // 2].get("why"))
    return out


def _setting(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def pays_why_lines(df) -> list[str]:
    """One line per region: the settings it spans, the baseline's regime, and its why."""
    axis = _axis_name(df)
    out = []
    for reg in pays_regions(df):
        span = _setting(reg["first"])
        if reg["last"] != reg["first"]:
            span += f"–{_setting(reg['last'])}"
        where = f"{reg['regime']}-bound" if reg["regime"] else "regime unknown"
        out.append(f"{axis} {span} ({where}): {reg['why']}")
    return out


def _axis_name(df) -> str:
    rows = _rows(df)
    return str(rows[0]["axis"]) if rows else str((getattr(df, "attrs", {}) or {}).get("axis", ""))


def _trick_name(df) -> str:
    rows = _rows(df)
    return str(rows[0]["trick"]) if rows else str((getattr(df, "attrs", {}) or {}).get("trick", ""))


# --- the chart of one trick ------------------------------------------------------------------------


def _pays_columns(df) -> dict[str, dict[str, Any]]:
    rows = _rows(df)
    kind = pays_x_kind([r["value"] for r in rows])
    xs = _objs(r["value"] for r in rows) if kind == "category" else np.array(_positions(rows, kind))
    hover = _objs(
        f"{r['axis']} {_setting(r['value'])}: {r['trick']} {_num(r['speedup']):.3g}x "
        f"({r.get('how', 'measured')}); predicted {_num(r.get('predicted_speedup')):.3g}x; "
        f"baseline {_num(r.get('baseline_s')) * 1e3:.3g} ms, trick {_num(r.get('trick_s')) * 1e3:.3g} ms"
        f"<br>{r.get('why') or ''}"
        + (f"<br>noisy timing: {r.get('noisy_reason')}" if r.get("noisy") is True else "")
        for r in rows
    )
    noisy = [r.get("noisy") is True for r in rows]
    bad = [i for i, r in enumerate(rows) if _unstable(r)]
    cols: dict[str, dict[str, Any]] = {
        "speedup (measured)": {
            "x": xs,
            "y": np.array([math.nan if _unstable(r) else _num(r["speedup"]) for r in rows]),
            "hovertext": hover,
            "marker.line.width": np.array([2.0 if n else 0.0 for n in noisy]),
            "marker.line.color": _objs(NOISY_COLOR if n else "rgba(0,0,0,0)" for n in noisy),
        },
        "speedup (modelled: cost model)": {
            "x": xs,
            "y": np.array([_num(r.get("predicted_speedup")) for r in rows]),
        },
        "unstable or not run (not averaged)": {
            "x": xs[bad] if len(bad) else xs[:0],
            "y": np.ones(len(bad)),
            "hovertext": _objs(_said(rows[i].get("why")) for i in bad),
        },
    }
    for name, key in (("measured", "crossover_measured"), ("predicted", "crossover_predicted")):
        at = _crossover_x(df, key, kind)
        cols[f"crossover ({name})"] = {
            "x": _objs([] if at is None else [at])
            if kind == "category"
            else np.array([] if at is None else [at], dtype=float),
            "y": np.ones(0 if at is None else 1),
        }
    band = pays_regions(df)
    for reg in REGIME_COLORS:
        mine = [b for b in band if b["regime"] == reg]
        mid = [_mid(b, kind) for b in mine]
        cols[f"{reg}-bound baseline"] = {
            "x": _objs(_category_at(rows, m) for m in mid) if kind == "category" else np.array(mid),
            "y": np.full(len(mine), _BAND_Y),
            "text": _objs(f"{reg}-bound" for _ in mine),
            "hovertext": _objs(b["why"] for b in mine),
        }
    return cols


def _mid(band: dict, kind: str) -> float:
    if kind == "log":
        return math.sqrt(band["x0"] * band["x1"])
    return (band["x0"] + band["x1"]) / 2


def _category_at(rows: list[dict], position: float):
    """The category nearest a position (text on a category axis is placed at a category)."""
    return rows[min(len(rows) - 1, max(0, round(position)))]["value"]


def _crossover_x(df, key: str, kind: str):
    at = (getattr(df, "attrs", {}) or {}).get(key)
    if at is None:
        return None
    if kind == "category":
        values = [r["value"] for r in _rows(df)]
        return at if at in values else None
    return _num(at) if _num(at) == _num(at) else None


def _pays_shapes(df) -> dict[str, Any]:
    """The regime bands, the 1x line and the crossover lines; the title says where it crosses."""
    rows = _rows(df)
    kind = pays_x_kind([r["value"] for r in rows])
    shapes = [
        dict(type="rect", xref="x", x0=b["x0"], x1=b["x1"], yref="y domain", y0=0, y1=1,
             fillcolor=REGIME_COLORS[b["regime"]], opacity=0.10, line=dict(width=0), layer="below")
        for b in pays_regions(df)
        if b["regime"] in REGIME_COLORS
    ]  # fmt: skip
    shapes.append(
        dict(type="line", xref="x domain", x0=0, x1=1, yref="y", y0=1, y1=1,
             line=dict(color="#333", width=1.5))
    )  # fmt: skip
    for key, dash in (("crossover_measured", "solid"), ("crossover_predicted", "dot")):
        at = _crossover_x(df, key, kind)
        if at is not None:
            x = [r["value"] for r in rows].index(at) if kind == "category" else at
            shapes.append(
                dict(type="line", xref="x", x0=x, x1=x, yref="y domain", y0=0, y1=1,
                     line=dict(color="#111", width=1.5, dash=dash))
            )  # fmt: skip
    return {"shapes": shapes, "title.text": pays_title(df)}


def pays_title(df) -> str:
    a = getattr(df, "attrs", {}) or {}
    trick, axis = _trick_name(df), _axis_name(df)
    if not trick:
        return "Where does it pay? Run a trick over a setting"

    def said(key: str) -> str:
        at = a.get(key)
        return "none in range" if at is None else f"{axis} = {_setting(_round(at))}"

    where = ", ".join(str(a[k]) for k in ("model", "device", "dtype") if a.get(k))
    if a.get("repeats"):
        where += f", median of {a['repeats']}"
    return (
        f"{trick} over {axis}: crosses 1x at {said('crossover_measured')} (measured), "
        f"{said('crossover_predicted')} (predicted)"
        + (f"<br>{where}" if where else "")
        + (" · PARTIAL: stopped before its last setting" if a.get("partial") else "")
    )


def _round(x):
    """A crossover (interpolated) to 3 significant figures."""
    return float(f"{x:.3g}") if isinstance(x, float) else x


@sweep_plot("pays", _pays_columns, _pays_shapes)
def pays_figure() -> go.Figure:
    """The empty chart: speedup over the setting on a log axis (1-2-5 ticks, 1x marked)."""
    fig = go.Figure(
        layout=dict(
            title=dict(text=pays_title(None), font=dict(size=13), x=0.01, xanchor="left"),
            xaxis=dict(title=dict(text="setting")),
            yaxis=dict(
                title=dict(text="speedup (baseline time / trick time)"),
                type="log",
                tickvals=_SPEEDUP_TICKS,
                ticktext=[f"{v:g}×" for v in _SPEEDUP_TICKS],
            ),
            yaxis2=dict(overlaying="y", range=[0, 1], visible=False, fixedrange=True),
        )
    )
    fig.add_trace(
        go.Scatter(name="speedup (measured)", x=[], y=[], mode="lines+markers", hovertext=[],
                   hoverinfo="text", line=dict(color="#1f77b4", width=2.5), marker=dict(size=8))
    )  # fmt: skip
    fig.add_trace(
        go.Scatter(name="speedup (modelled: cost model)", x=[], y=[], mode="lines+markers",
                   line=dict(color="#555", dash="dot"), marker=dict(size=6, symbol="circle-open"))
    )  # fmt: skip
    fig.add_trace(
        go.Scatter(name="unstable or not run (not averaged)", x=[], y=[], mode="markers",
                   hovertext=[], hoverinfo="text",
                   marker=dict(symbol="x-thin-open", size=12, line=dict(width=2, color="#d62728")))
    )  # fmt: skip
    for name, symbol in (("measured", "star"), ("predicted", "diamond-open")):
        fig.add_trace(
            go.Scatter(name=f"crossover ({name})", x=[], y=[], mode="markers",
                       marker=dict(symbol=symbol, size=14, color="#111"))
        )  # fmt: skip
    for reg, color in REGIME_COLORS.items():
        fig.add_trace(
            go.Scatter(name=f"{reg}-bound baseline", x=[], y=[], yaxis="y2", mode="text", text=[],
                       hovertext=[], hoverinfo="text", textfont=dict(color=color, size=11))
        )  # fmt: skip
    return fig


def pays_chart(df, *, height: int = 440) -> go.Figure:
    """One trick over one setting, whole (for notebooks, the README and the dashboard's tab):
    the registered chart, its axis named, the speedup range fitted, and the why lines under it."""
    from explorer.plots.sweeps import sweep_figure

    blocks = [_wrap(line) for line in pays_why_lines(df)]  # one block (1+ lines) per region
    rows_of = [b.count("<br>") + 1 for b in blocks]
    fig = sweep_figure("pays", height=height + _LINE_PX * sum(rows_of))
    replace(fig, _pays_columns(df))
    extras = _pays_shapes(df)
    kind = pays_x_kind([r["value"] for r in _rows(df)])
    below = [48 + _LINE_PX * sum(rows_of[:i]) for i in range(len(blocks))]  # px under the plot
    fig.update_layout(
        shapes=extras["shapes"],
        title_text=extras["title.text"],
        xaxis=dict(title_text=_axis_name(df) or "setting", type=kind),
        yaxis_range=_speedup_range(df),
        margin=dict(b=60 + _LINE_PX * sum(rows_of)),
        legend=dict(orientation="v", x=1.02, y=1, xanchor="left", yanchor="top"),
        annotations=[
            dict(xref="paper", yref="paper", x=0, y=0, xanchor="left", yanchor="top",
                 yshift=-px, showarrow=False, align="left", text=block,
                 font=dict(size=11, color=REGIME_COLORS.get(reg["regime"], "#333")))
            for block, px, reg in zip(blocks, below, pays_regions(df))
        ],
    )  # fmt: skip
    if kind == "log":
        fig.update_xaxes(**LOG_AXIS)
    return fig


def _wrap(line: str, width: int = WHY_WIDTH) -> str:
    """A why line broken (<br>) at spaces into lines of at most `width` characters (continuation
    lines indented)."""
    return "<br>".join(textwrap.wrap(line, width, subsequent_indent="    ", break_long_words=False))


def _speedup_range(df) -> list[float]:
    """log10 range of the speedup axis: every speedup (measured and predicted) and 1x, padded."""
    ys = [1.0]
    for r in _rows(df):
        for k in ("speedup", "predicted_speedup"):
            v = _num(r.get(k))
            if v == v and v > 0:
                ys.append(v)
    lo, hi = math.log10(min(ys)), math.log10(max(ys))
    pad = max(0.08, 0.12 * (hi - lo))
    return [lo - pad, hi + pad + 0.1]  # room at the top for the regions' labels


# --- the atlas ---------------------------------------------------------------------------------------


def pays_atlas(frames, *, clip: float = 4.0) -> go.Figure:
    """Every trick side by side: one row per (trick, setting axis), one cell per setting, green
    where the trick pays (measured speedup > 1), red where it costs, white at 1x (colour: log2 of
    the speedup, clipped at clip x either way); a cell with no steady figure stays grey."""
    from plotly.subplots import make_subplots

    groups: dict[tuple[str, str], list[dict]] = {}
    for df in frames:
        for r in _rows(df):
            groups.setdefault((str(r["trick"]), str(r["axis"])), []).append(r)
    keys = list(groups) or [("", "")]
    fig = make_subplots(rows=len(keys), cols=1, vertical_spacing=min(0.6 / max(len(keys), 1), 0.12))
    top = math.log2(clip)
    for i, key in enumerate(keys, start=1):
        rows = groups.get(key, [])
        z = [math.log2(s) if s == s and s > 0 and not _unstable(r) else None
             for r, s in ((r, _num(r["speedup"])) for r in rows)]  # fmt: skip
        fig.add_trace(
            go.Heatmap(
                name=f"{key[0]} over {key[1]}",
                x=[_setting(r["value"]) for r in rows],
                y=[f"{key[0]}<br>over {key[1]}"],
                z=[z],
                text=[[_cell_text(r) for r in rows]],
                texttemplate="%{text}",
                hovertext=[[_said(r.get("why")) for r in rows]],
                hoverinfo="text",
                coloraxis="coloraxis",
                xgap=2,
            ),
            row=i,
            col=1,
        )
        fig.update_xaxes(type="category", row=i, col=1)
    fig.update_layout(
        coloraxis=dict(
            colorscale=[[0, COSTS_COLOR], [0.5, "#f7f7f7"], [1, PAYS_COLOR]], cmin=-top, cmax=top,
            colorbar=dict(title=dict(text="speedup", side="top"), tickvals=[-top, -1, 0, 1, top],
                          ticktext=[f"{1 / clip:g}×", "0.5×", "1×", "2×", f"{clip:g}×"], len=0.9),
        ),
        plot_bgcolor="#e5e5e5",
    )  # fmt: skip
    return _house_style(
        fig,
        height=90 + 95 * len(keys),
        title=dict(
            text="Where each trick pays: green faster than its baseline, red slower (measured)",
            font=dict(size=13),
        ),
        plot_bgcolor="#e5e5e5",
    )


def _cell_text(row: dict) -> str:
    s, skipped = _num(row["speedup"]), _said(row.get("skipped"))
    if row.get("steady") is False or skipped.startswith("unstable"):
        return "unstable"
    if skipped or s != s:
        return "not run"
    return f"{s:.2g}×"
