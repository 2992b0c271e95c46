"""Inside the step: the logit lens and the newest token's attention (explorer.inside), measured on
the model in one replayed forward pass of the selected step.

    lens_figure(records)              layers x top-n ranks, coloured by probability, token text in
                                      the cells; beside it prob of the chosen token, entropy, KL
    attention_figure(att, head=None)  layers x context positions: mean over heads ("mean"), max over
                                      heads ("max") or one head (an int); the sink column is position 0
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from explorer.plots.common import _house_style, show_token


def lens_figure(records: list[dict] | None = None, *, height: int = 420) -> go.Figure:
    """Session.logit_lens() records: where in depth the model 'decides' on the chosen token."""
    records = records or []
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.62, 0.38],
        horizontal_spacing=0.12,
        subplot_titles=("top tokens per layer (residual -> final norm -> lm_head)", "per layer"),
    )
    if records:
        _add_lens_traces(fig, records)
    fig.update_yaxes(title_text="layer (0 = first)", row=1, col=1)
    fig.update_yaxes(title_text="layer", row=1, col=2)
    fig.update_xaxes(title_text="prob / nats", row=1, col=2)
    return _house_style(
        fig,
        height=height,
        legend=dict(orientation="h", x=0.62, y=0, yref="container", yanchor="bottom"),
        margin=dict(l=60, r=20, t=70, b=90),
        title=dict(
            text="Logit lens (measured: one replayed pass)" if records else "Run the logit lens",
            font=dict(size=13),
        ),
    )


def _add_lens_traces(fig: go.Figure, records: list[dict]) -> None:
    """The top tokens per layer as a heatmap (left) and, per layer, the chosen token's
    probability, the entropy and the KL to the final distribution (right)."""
    n = max(len(r["top"]) for r in records)
    layers = [r["layer"] for r in records]
    z = np.full((len(records), n), np.nan)
    text = np.full((len(records), n), "", dtype=object)
    for i, r in enumerate(records):
        for j, t in enumerate(r["top"]):
            z[i, j], text[i, j] = t["prob"], show_token(t["text"])
    fig.add_trace(
        go.Heatmap(
            name="top tokens (measured)",
            z=z,
            x=[f"#{j + 1}" for j in range(n)],
            y=layers,
            text=text,
            texttemplate="%{text}",
            colorscale="Blues",
            zmin=0,
            zmax=1,
            colorbar=dict(title="prob", x=0.56, len=0.9),
            hovertemplate="layer %{y}, rank %{x}: %{text} p=%{z:.3f}<extra></extra>",
        ),
        row=1,
        col=1,
    )
    for name, key, color in (
        ("prob of the chosen token", "prob_chosen", "#c44e52"),
        ("entropy (nats)", "entropy", "#4c72b0"),
        ("KL to final (nats)", "kl_to_final", "#55a868"),
    ):
        fig.add_trace(
            go.Scatter(
                name=name,
                x=[r[key] for r in records],
                y=layers,
                mode="lines+markers",
                line=dict(color=color),
            ),
            row=1,
            col=2,
        )


def attention_rows(att: dict, head: int | str | None = "mean") -> list[list[float]]:
    """[layers][positions] of att for head: "mean" / None (mean over heads), "max", or a head index."""
    if head in (None, "mean"):
        return att["mean"]
    if head == "max":
        return att["max"]
    h = int(head)
    if not 0 <= h < att["heads"]:
        raise ValueError(f"head {h} is out of range: this model has heads 0..{att['heads'] - 1}")
    return [layer[h] for layer in att["weights"]]


def _short(label: str, most: int = 10) -> str:
    """A tick label cut to `most` characters (the whole token stays in the hover)."""
    return label if len(label) <= most else label[: most - 1] + "…"


SINK_SHARE = 0.2  # a first token drawing this share of attention or more is called a sink


def attention_figure(
    att: dict | None = None, head: int | str | None = "mean", *, height: int = 420
) -> go.Figure:
    """Session.attention(): the newest token's attention, layers x context positions."""
    fig = go.Figure()
    if att:
        rows = attention_rows(att, head)
        tokens = [show_token(t) for t in att.get("tokens", [])]
        fig.add_trace(
            go.Heatmap(
                name="attention (measured)",
                z=rows,
                x=att["positions"],
                y=list(range(att["layers"])),
                customdata=[tokens] * att["layers"] if tokens else None,
                colorscale="Viridis",
                zmin=0,
                colorbar=dict(title="weight"),
                hovertemplate=(
                    "layer %{y}, position %{x}"
                    + (" (%{customdata})" if tokens else "")
                    + ": %{z:.3f}<extra></extra>"
                ),
            )
        )
        which = {"mean": "mean over heads", "max": "max over heads", None: "mean over heads"}.get(
            head, f"head {head}"
        )
        sink = float(np.mean(att["sink"])) if att.get("sink") else None
        title = (
            f"Attention of the newest token ({which}; {att['layers']} layers x {att['heads']} heads, "
            f"eager attention for this pass)"
            + (
                f" · {100 * sink:.0f}% on the first token, mean over layers"
                + (" (an attention sink)" if sink >= SINK_SHARE else "")
                if sink is not None
                else ""
            )
        )
    else:
        title = "Show the attention of the newest token"
    if att and att.get("tokens"):  # each column labelled by its token (position in the hover)
        labels = [_short(show_token(t)) for t in att["tokens"]]
        every = max(1, len(labels) // 40)  # at most ~40 labels across the chart
        fig.update_xaxes(
            tickmode="array",
            tickvals=att["positions"][::every],
            ticktext=labels[::every],
            tickangle=-60,
        )
    # the rotated token labels need the title pushed below them (standoff + automargin)
    fig.update_xaxes(title=dict(text="context token (position 0 = first)", standoff=14))
    fig.update_yaxes(title_text="layer")
    return _house_style(
        fig, height=height, margin=dict(l=60, r=20, t=60, b=90),
        title=dict(text=title, font=dict(size=13)),
    )  # fmt: skip
