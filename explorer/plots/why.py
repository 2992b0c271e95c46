"""Why a step took its time: the speed-of-light split, the profiler breakdown, the trust table.

    split_figure(step)          one step as a stacked bar: the binding side's floors + the overhead
                                (sums to the measured latency exactly), MBU / MFU / regime in the title
    profile_figure(profile)     Session.profile_step(): measured time by part beside its modelled floor
    trust_figure(rows)          explorer.costs.trust rows: predicted vs measured with the error %

Floors are modelled (cost-model bytes or FLOPs at this machine's measured peaks); the latency and
the profiler's times are measured; the overhead is measured latency minus the modelled bound.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from explorer.costs.split import MEMORY_PARTS
from explorer.plots.common import PART_COLORS, _field, _layout

SPLIT_COLORS = {**PART_COLORS, "compute": "#8172b3", "overhead": "#937860"}


def split_stack(obj: Any) -> dict[str, float] | None:
    """{part: seconds} that add up to the measured latency: the binding side's floors (weights,
    kv_read, kv_write when memory-bound; compute when compute-bound) and then the overhead.
    obj: a Step (its split fields) or a dict from explorer.costs.split; None without a split."""
    if isinstance(obj, dict) and obj.get("stack"):
        return dict(obj["stack"])
    floors, overhead = _field(obj, "floors"), _field(obj, "overhead_s")
    if not floors or overhead is None:
        return None
    binding = MEMORY_PARTS if _field(obj, "bound") == "memory" else ("compute",)
    return {k: floors.get(k, 0.0) for k in binding} | {"overhead": overhead}


def split_title(obj: Any) -> str:
    """'step 7 (decode): 5.9 ms measured = 0.36 ms bound + 5.5 ms overhead · MBU 0.04 · MFU 0.00 · overhead-bound'."""
    lat, bound_s = _field(obj, "latency_s"), _field(obj, "bound_s")
    index, phase = _field(obj, "index"), _field(obj, "phase")
    head = f"step {index} ({phase})" if index is not None else "this step"
    if lat is None or bound_s is None:
        return f"{head}: no split (no measured peaks or latency)"
    mbu, mfu, reg = _field(obj, "mbu"), _field(obj, "mfu"), _field(obj, "regime")
    bits = [
        f"{head}: {lat * 1e3:.3g} ms measured = {bound_s * 1e3:.3g} ms bound + "
        f"{(lat - bound_s) * 1e3:.3g} ms overhead"
    ]
    if mbu is not None:
        bits.append(f"MBU {mbu:.2f}")
    if mfu is not None:
        bits.append(f"MFU {mfu:.2f}")
    if reg:
        bits.append(f"{reg}-bound")
    return " · ".join(bits)


# Titles start at the left edge and the plotly toolbar stands down the right side, so a long title
# never runs under the toolbar's buttons.
_TITLE = dict(font=dict(size=13), x=0.01, xanchor="left")
_MODEBAR = dict(orientation="v")


def split_figure(obj: Any = None, *, height: int = 220) -> go.Figure:
    """One step's time as a horizontal stacked bar (ms): modelled floors, then the overhead residual
    (measured latency - modelled bound). Without a split: an empty bar with the reason as title."""
    stack = split_stack(obj) if obj is not None else None
    fig = go.Figure(
        layout=_layout(
            height=height,
            barmode="stack",
            title=dict(
                text=split_title(obj) if obj is not None else "select a step to see its split",
                **_TITLE,
            ),
            modebar=_MODEBAR,
            xaxis=dict(title="ms (floors: modelled at measured peaks; overhead: measured - bound)"),
            yaxis=dict(showticklabels=False, showgrid=False),
            legend=dict(orientation="h", x=0, y=0, yref="container", yanchor="bottom"),
            margin=dict(l=20, r=44, t=50, b=110),
        )
    )
    for part, seconds in (stack or {}).items():
        label = "overhead (measured - bound)" if part == "overhead" else f"{part} floor (modelled)"
        fig.add_trace(
            go.Bar(
                name=label,
                x=[seconds * 1e3],
                y=["step"],
                orientation="h",
                marker=dict(color=SPLIT_COLORS.get(part, "#999")),
                hovertemplate=f"{label}: %{{x:.3g}} ms<extra></extra>",
            )
        )
    return fig


def profile_figure(profile: dict | None = None, *, height: int = 380) -> go.Figure:
    """Session.profile_step()'s parts: measured time (bars) beside the part's modelled floor (dots)."""
    rows = [r for r in (profile or {}).get("parts", []) if r["time_s"] > 0 or r.get("floor_s")]
    if profile:
        cov = profile.get("coverage")
        title = (
            f"step {profile['step']} ({profile['phase']}) under torch.profiler on {profile['device']} "
            f"{profile['dtype']}, median of {profile['repeats']}: {profile['wall_s'] * 1e3:.3g} ms "
            f"profiled · {100 * profile['python_share']:.0f}% framework/Python"
            + (f" · {100 * cov:.0f}% attributed" if cov is not None else "")
        )
    else:
        title = "Profile a step to see where its time goes"
    parts = [r["part"] for r in rows]
    fig = go.Figure(
        data=[
            go.Bar(
                name="time (measured)",
                x=[r["time_s"] * 1e3 for r in rows],
                y=parts,
                orientation="h",
                marker=dict(color="#4c72b0"),
                customdata=[100 * r["share"] for r in rows],
                hovertemplate="%{y}: %{x:.3g} ms (%{customdata:.0f}%)<extra>measured</extra>",
            ),
            go.Scatter(
                name="floor (modelled: bytes or FLOPs at measured peaks)",
                x=[
                    (r["floor_s"] or 0) * 1e3 if r.get("floor_s") is not None else None
                    for r in rows
                ],
                y=parts,
                mode="markers",
                marker=dict(symbol="line-ns", size=18, line=dict(width=3, color="#c44e52")),
                hovertemplate="%{y}: floor %{x:.3g} ms<extra>modelled</extra>",
            ),
        ],
        layout=_layout(
            height=height,
            title=dict(text=title, **_TITLE),
            modebar=_MODEBAR,
            xaxis=dict(title="ms"),
            yaxis=dict(autorange="reversed"),
            legend=dict(orientation="h", x=0, y=0, yref="container", yanchor="bottom"),
            margin=dict(l=140, r=44, t=60, b=90),
        ),
    )
    return fig


def trust_figure(rows: list[dict] | None = None, *, height: int = 300) -> go.Figure:
    """The trust table (explorer.costs.trust) as a table figure: each prediction beside its measurement."""
    rows = rows or []

    def fmt(v, unit=""):
        if v is None:
            return "–"
        if unit == "s":
            return f"{v * 1e3:.3g} ms"
        if unit == "x":
            return f"{v:.3g}x"
        return f"{v:.3g} {unit}".rstrip()

    cols = {
        "prediction": [r["prediction"] for r in rows],
        "group": [str(r["group"]) for r in rows],
        "n": [r["n"] for r in rows],
        "predicted": [fmt(r["predicted"], r["unit"]) for r in rows],
        "measured": [fmt(r["measured"], r["unit"]) for r in rows],
        "error (median)": [f"{r['err_pct']:+.0f}%" for r in rows],
        "|error| (median)": [f"{r['abs_err_pct']:.0f}%" for r in rows],
        "basis": [r["basis"] for r in rows],
    }
    fig = go.Figure(
        data=[
            go.Table(
                columnwidth=[130, 70, 30, 70, 70, 60, 60, 330],
                header=dict(values=list(cols), fill_color="#f0f0f0", align="left"),
                cells=dict(values=list(cols.values()), align="left", height=22),
            )
        ],
        layout=dict(
            height=height,
            margin=dict(l=10, r=10, t=40, b=10),
            title=dict(
                text="Trust: each prediction beside the measurement (error < 0: optimistic)"
                if rows
                else "Trust: no predictions to check yet (take some steps)",
                font=dict(size=13),
            ),
            paper_bgcolor="white",
        ),
    )
    return fig
