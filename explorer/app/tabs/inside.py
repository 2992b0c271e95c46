"""The "Inside" tab: what happens inside the selected step, on demand (explorer.inside).

    Logit lens   the residual stream after each layer through the final norm and lm_head
    Attention    the newest token's attention over the context, per layer (mean / max over heads
                 or one head from the picker)
    Routing      a mixture of experts: the router's choice per layer in the step (fetched on demand:
                 Session.routing(step) replays it with the routers hooked) and the experts the
                 batch touched; the load per expert over the trace (recorded as each step ran).
                 A dense model says it is dense.
The views replay the step once more with scoped hooks (nothing stays hooked after it); an architecture
that does not expose what they need says so in the message area, and the charts keep what they showed.
"""

from __future__ import annotations

import ipywidgets as W

from explorer import plots
from explorer.app.controls import button, tagged
from explorer.app.tabs import Tab, register
from explorer.app.views import figure_widget

HEAD_AGGREGATES = [("mean over heads", "mean"), ("max over heads", "max")]
ROUTING_CHARTS = (
    ("inside-routing", plots.routing_figure),
    ("inside-expert-load", plots.expert_load_figure),
)


CHARTS = (
    ("inside-lens", plots.lens_figure),
    ("inside-attention", plots.attention_figure),
    *ROUTING_CHARTS,
)


def build() -> tuple[W.Widget, dict]:
    """The tab's widget and its parts (name -> widget, CSS class ie-<name>); no callbacks."""
    parts: dict = {}
    for name, builder in CHARTS:
        parts[name] = figure_widget(builder)
        parts[name].add_class(f"ie-{name}")
    parts["inside-lens-run"] = button(
        "inside-lens-run", "Logit lens", "layer-group", width=None,
        tip="each layer's residual through the final norm and lm_head",
    )  # fmt: skip
    parts["inside-attention-run"] = button(
        "inside-attention-run", "Attention", "eye", width=None,
        tip="the newest token's attention over the context (one eager pass)",
    )  # fmt: skip
    parts["inside-head"] = tagged(
        W.Dropdown(
            options=HEAD_AGGREGATES,
            value="mean",
            description="heads",
            layout=W.Layout(width="240px"),
        ),
        "inside-head",
    )
    parts["inside-routing-run"] = button(
        "inside-routing-run", "Routing", "random", width=None,
        tip="a mixture of experts: the experts each layer's router chose in this step",
    )  # fmt: skip
    parts["inside-text"] = tagged(W.HTML(), "inside-text")
    row = ("inside-lens-run", "inside-attention-run", "inside-head", "inside-routing-run")
    widget = W.VBox(
        [W.HBox([parts[n] for n in row]), parts["inside-text"]]
        + [parts[name] for name, _ in CHARTS]
    )
    widget.add_class("ie-inside")
    parts["inside"] = widget
    return widget, parts


@register(36)
class InsideTab(Tab):
    name, title = "inside", "Inside"
    about = (
        "Inside the step you selected in the strip (or the latest): each button replays that step "
        "once more on the model (measured) with hooks that are removed after it. The logit lens "
        "shows each layer's best guess for the next token; attention shows which earlier tokens "
        "the newest one looks at. Routing (a mixture of experts) shows which experts each layer's "
        "router chose in the step, and the load per expert over the trace."
    )

    def __init__(self, dash):
        super().__init__(dash)
        self.lens: list[dict] | None = None
        self.att: dict | None = None
        self.routing: dict | None = None
        self.widget, self.parts = build()
        p, g = self.parts, dash.guard
        self.buttons = [p["inside-lens-run"], p["inside-attention-run"], p["inside-routing-run"]]
        p["inside-lens-run"].on_click(lambda _: g.call("The logit lens", self.run_lens))
        p["inside-attention-run"].on_click(lambda _: g.call("Attention", self.run_attention))
        p["inside-routing-run"].on_click(lambda _: g.call("Routing", self.run_routing))
        p["inside-head"].observe(
            lambda ch: g.call("Picking a head", self.show_attention, while_busy=True),
            names="value",
        )

    def figures(self):
        return [self.parts[name] for name, _ in CHARTS]

    def set_busy(self, busy: bool) -> None:
        for b in self.buttons:
            b.disabled = busy

    def steps_reset(self, steps) -> None:
        self.parts["inside-text"].value = ""

    def session_changed(self) -> None:
        self.lens = self.att = self.routing = None
        self.parts["inside-head"].options = HEAD_AGGREGATES
        for name, builder in CHARTS:
            plots.redraw(self.parts[name], builder())

    def run_lens(self) -> None:
        index = self.dash.shown_index()
        self.lens = self.dash.session.logit_lens(index)
        plots.redraw(self.parts["inside-lens"], plots.lens_figure(self.lens))
        last = self.lens[-1]
        decided = next((r["layer"] for r in self.lens if r["rank_chosen"] == 0), None)
        where = (
            f"first tops the lens at layer {decided} (layers 0..{last['layer']})"
            if decided is not None
            else f"never tops the lens (at the last layer it ranks {last['rank_chosen'] + 1}; "
            + (
                "it was forced, not drawn)"
                if self._forced(index)
                else "the sampler drew it from further down)"
            )
        )
        self.parts["inside-text"].value = (
            f"Step {'(pending)' if index is None else index}: the chosen token {where}; at the "
            f"last layer its probability is {last['prob_chosen']:.3f}."
        )
        self.dash.guard.say("Logit lens done.", "ok")

    def _forced(self, index: int | None) -> bool:
        steps = self.dash.session.steps
        return index is not None and bool(steps[index].forced)

    def run_attention(self) -> None:
        index = self.dash.shown_index()
        self.att = self.dash.session.attention(index)
        heads = [(f"head {h}", h) for h in range(self.att["heads"])]
        head = self.parts["inside-head"]
        keep = head.value
        head.options = [*HEAD_AGGREGATES, *heads]
        head.value = keep if keep in ("mean", "max") or keep < self.att["heads"] else "mean"
        self.show_attention()
        sink = self.att.get("sink") or []
        share = sum(sink) / len(sink) if sink else None
        self.parts["inside-text"].value = (
            f"Step {'(pending)' if index is None else index}: {len(self.att['positions'])} positions"
            + (
                f"; on average {100 * share:.0f}% of each layer's attention goes to the first "
                "token" + (" (an attention sink)" if share >= plots.SINK_SHARE else "")
                if share is not None
                else ""
            )
            + "."
        )
        self.dash.guard.say("Attention done.", "ok")

    def show_attention(self) -> None:
        if self.att is not None:
            plots.redraw(
                self.parts["inside-attention"],
                plots.attention_figure(self.att, self.parts["inside-head"].value),
            )

    # --- a mixture of experts: the router's choice ---

    def run_routing(self) -> None:
        session, index = self.dash.session, self.dash.shown_index()
        text = self.parts["inside-text"]
        whole = session.routing()
        if whole["dense"]:
            text.value = f"{whole['message']}. The other views work as for any model."
            self.dash.guard.say("Routing: the model is dense.", "ok")
            return
        if index is None:
            text.value = "Routing: take a step first (the routers' choice is read from a step)."
            return
        self.routing = session.routing(index)
        plots.redraw(self.parts["inside-routing"], plots.routing_figure(self.routing))
        plots.redraw(self.parts["inside-expert-load"], plots.expert_load_figure(whole))
        text.value = routing_text(index, self.routing, whole)
        self.dash.guard.say("Routing done.", "ok")


def routing_text(index: int, one: dict, whole: dict) -> str:
    """One line on a step's routing: experts touched per layer against E and the uniform formula."""
    step = one["steps"][0]
    if step["experts_touched"] is None:
        return f"Step {index}: {one['message'] or 'no routing recorded for this step'}."
    e, touched = one["num_experts"], step["experts_touched"]
    return (
        f"Step {index}: {step['tokens']} tokens routed ({step['batch']} rows), "
        f"{whole['experts_per_token']} experts each per layer; the batch touched "
        f"{', '.join(map(str, touched))} of {e} experts per layer (uniform routing would touch "
        f"{step['experts_touched_formula']:.1f}); the rest of the experts' weights were not read."
    )
