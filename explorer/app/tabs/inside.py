"""The "Inside" tab: what happens inside the selected step, on demand (explorer.inside).

    Logit lens   the residual stream after each layer through the final norm and lm_head
    Attention    the newest token's attention over the context, per layer (mean / max over heads
                 or one head from the picker)
    Routing      a mixture of experts: the router's choice per layer in the step (recorded as it
                 ran: Session.routing()) and the experts the batch touched; the load per expert
                 over the trace. A dense model says it is dense.
The lens and attention replay the step once more with scoped hooks (nothing stays hooked after it); an architecture
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


@register(36)
class InsideTab(Tab):
    name, title = "inside", "Inside"
    about = (
        "Inside the step you selected in the strip (or the latest): each button replays that step "
        "once more on the model (measured) with hooks that are removed after it. The logit lens "
        "shows each layer's best guess for the next token; attention shows which earlier tokens "
        "the newest one looks at. Routing (a mixture of experts) shows which experts each layer's "
        "router chose in the step, as recorded when it ran, and the load per expert over the trace."
    )

    def __init__(self, dash):
        super().__init__(dash)
        self.lens: list[dict] | None = None
        self.att: dict | None = None
        self.charts = {
            "inside-lens": figure_widget(plots.lens_figure),
            "inside-attention": figure_widget(plots.attention_figure),
        }
        for name, fig in self.charts.items():
            fig.add_class(f"ie-{name}")
        self.lens_button = button(
            "inside-lens-run", "Logit lens", "layer-group", width=None,
            tip="each layer's residual through the final norm and lm_head",
        )  # fmt: skip
        self.att_button = button(
            "inside-attention-run", "Attention", "eye", width=None,
            tip="the newest token's attention over the context (one eager pass)",
        )  # fmt: skip
        self.head = tagged(
            W.Dropdown(
                options=HEAD_AGGREGATES,
                value="mean",
                description="heads",
                layout=W.Layout(width="240px"),
            ),
            "inside-head",
        )
        self.lens_button.on_click(lambda _: dash.guard.call("The logit lens", self.run_lens))
        self.att_button.on_click(lambda _: dash.guard.call("Attention", self.run_attention))
        self.head.observe(
            lambda ch: dash.guard.call("Picking a head", self.show_attention, while_busy=True),
            names="value",
        )
        self.text = tagged(W.HTML(), "inside-text")
        routing = self._build_routing(dash)
        self.parts = {
            **self.charts,
            "inside-lens-run": self.lens_button,
            "inside-attention-run": self.att_button,
            "inside-head": self.head,
            "inside-text": self.text,
            **routing,
        }
        self.widget = W.VBox(
            [
                W.HBox([self.lens_button, self.att_button, self.head, self.routing_button]),
                self.text,
                self.charts["inside-lens"],
                self.charts["inside-attention"],
                self.charts["inside-routing"],
                self.charts["inside-expert-load"],
            ]
        )
        self.widget.add_class("ie-inside")
        self.parts["inside"] = self.widget

    def figures(self):
        return list(self.charts.values())

    def set_busy(self, busy: bool) -> None:
        self.lens_button.disabled = busy
        self.att_button.disabled = busy
        self.routing_button.disabled = busy

    def steps_reset(self, steps) -> None:
        self.text.value = ""

    def session_changed(self) -> None:
        self.lens = self.att = self.routing = None
        self.head.options = HEAD_AGGREGATES
        for name, builder in (
            ("inside-lens", plots.lens_figure),
            ("inside-attention", plots.attention_figure),
            *ROUTING_CHARTS,
        ):
            plots.redraw(self.charts[name], builder())

    def run_lens(self) -> None:
        index = self.dash.shown_index()
        self.lens = self.dash.session.logit_lens(index)
        plots.redraw(self.charts["inside-lens"], plots.lens_figure(self.lens))
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
        self.text.value = (
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
        keep = self.head.value
        self.head.options = [*HEAD_AGGREGATES, *heads]
        self.head.value = keep if keep in ("mean", "max") or keep < self.att["heads"] else "mean"
        self.show_attention()
        sink = self.att.get("sink") or []
        share = sum(sink) / len(sink) if sink else None
        self.text.value = (
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
                self.charts["inside-attention"], plots.attention_figure(self.att, self.head.value)
            )

    # --- a mixture of experts: the router's choice (recorded during the step, nothing replayed) ---

    def _build_routing(self, dash) -> dict:
        """The Routing button and its two charts; returns them as parts."""
        self.routing: dict | None = None
        for name, builder in ROUTING_CHARTS:
            self.charts[name] = figure_widget(builder)
            self.charts[name].add_class(f"ie-{name}")
        self.routing_button = button(
            "inside-routing-run", "Routing", "random", width=None,
            tip="a mixture of experts: the experts each layer's router chose in this step",
        )  # fmt: skip
        self.routing_button.on_click(lambda _: dash.guard.call("Routing", self.run_routing))
        return {
            "inside-routing-run": self.routing_button,
            "inside-routing": self.charts["inside-routing"],
            "inside-expert-load": self.charts["inside-expert-load"],
        }

    def run_routing(self) -> None:
        session, index = self.dash.session, self.dash.shown_index()
        whole = session.routing()
        if whole["dense"]:
            self.text.value = f"{whole['message']}. The other views work as for any model."
            self.dash.guard.say("Routing: the model is dense.", "ok")
            return
        if index is None:
            self.text.value = "Routing: take a step first (each step records its routers' choice)."
            return
        self.routing = session.routing(index)
        plots.redraw(self.charts["inside-routing"], plots.routing_figure(self.routing))
        plots.redraw(self.charts["inside-expert-load"], plots.expert_load_figure(whole))
        self.text.value = routing_text(index, self.routing, whole)
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
