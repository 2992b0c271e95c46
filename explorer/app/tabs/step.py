"""The "The step, drawn" tab: the selected step as a picture of the model, op by op.

    picture    explorer.plots.step_figure over the step's operators (explorer.costs.operators)
               timed at this machine's measured peaks or a chosen chip's (modelled); redrawn when a
               step is taken or selected, only while the tab is shown
    Measure    explorer.costs.opprofile.profile_session_ops: the step once more under
               torch.profiler, each op's measured time beside its modelled one
    roofline   the operators on the machine's (or chip's) roofline (explorer.plots.ops_roofline_figure)
Clicking a layer of the stack opens it (MoE: the experts this step routed to in that layer light up).
"""

from __future__ import annotations

import time

import ipywidgets as W

from explorer import plots
from explorer.app.controls import button, tagged
from explorer.app.tabs import Tab, register
from explorer.app.views import figure_widget
from explorer.costs import hardware
from explorer.costs.operators import UnknownFamily, coarse_operators
from explorer.costs.opprofile import fused_attention, profile_session_ops, step_table
from explorer.costs.optime import timed

HERE = "this machine (measured peaks)"
ATTENTION_OPS = ("attention", "qk_scores", "softmax", "attn_v")


def chip_choices() -> list[str]:
    return [HERE] + [c.short_name for c in hardware.KNOWN_CHIPS.values()]


def chip_peaks_for(name: str):
    """A chip's modelled peaks in the first of bf16, fp16, fp32 it has a figure for."""
    chip = hardware.chip_named(name)
    dtype = next(d for d in ("bfloat16", "float16", "float32") if d in chip.dtypes())
    return hardware.chip_peaks(name, dtype)


def build() -> tuple[W.Widget, dict]:
    """The tab's widget and its parts (name -> widget, CSS class ie-<name>); no callbacks."""
    parts = {
        "step-picture": tagged(figure_widget(plots.step_figure), "step-picture"),
        "step-roofline": tagged(figure_widget(plots.ops_roofline_figure), "step-roofline"),
        "step-chip": tagged(
            W.Dropdown(
                options=chip_choices(),
                value=HERE,
                description="roofs of",
                layout=W.Layout(width="340px"),
            ),
            "step-chip",
        ),  # fmt: skip
        "step-measure": button(
            "step-measure",
            "Measure this step",
            "search",
            width=None,
            tip="run the step once more under torch.profiler: measured time per operator",
        ),  # fmt: skip
        "step-walk": button(
            "step-walk",
            "Walk the layers",
            "play",
            width=None,
            tip="light each layer in turn, as the step runs through them",
        ),  # fmt: skip
        "step-text": tagged(W.HTML(), "step-text"),
    }
    widget = W.VBox(
        [W.HBox([parts[n] for n in ("step-chip", "step-measure", "step-walk")])]
        + [parts[n] for n in ("step-text", "step-picture", "step-roofline")]
    )
    widget.add_class("ie-step-tab")
    parts["step-tab"] = widget
    return widget, parts


@register(36)
class StepTab(Tab):
    name, title = "step", "The step, drawn"
    about = (
        "The selected step drawn as the model it runs through: one layer opened into its "
        "operators, each box sized by its share of the step and coloured by what bounds it "
        "(modelled at the roofs; press Measure for this machine's measured time per op). Prefill "
        "turns the matmuls compute-bound, decode leaves them memory-bound."
    )

    def __init__(self, dash):
        super().__init__(dash)
        self.live, self.measured, self.opened = False, None, 0
        self.drawn: int | None = None  # the step the picture shows (None: not drawn yet)
        self._key: tuple | None = None  # the structure of the picture drawn (names, layers, ...)
        self.rows: list[dict] = []
        self.walk_delay, self.walked, self.played = 0.05, [], -1
        self.widget, self.parts = build()
        p, g = self.parts, dash.guard
        self.fig, self.roof = p["step-picture"], p["step-roofline"]
        self.chip, self.text = p["step-chip"], p["step-text"]
        self.chip.observe(lambda _: self.refresh(), names="value")
        p["step-measure"].on_click(lambda _: g.call("Measuring the step", self.measure))
        p["step-walk"].on_click(lambda _: g.call("Walking the layers", self.walk))

    # --- the Tab protocol ---

    def figures(self):
        return [self.fig, self.roof]

    def export_figures(self) -> dict:
        return {"step drawn": self.fig, "operators roofline": self.roof}

    def set_live(self, live: bool) -> None:
        self.live = live
        if live:
            self.refresh()

    def steps_added(self, steps) -> None:
        self.measured = None
        if self.live and self.dash.selected is None:
            self.refresh()
            if self.dash.guard.busy == "Play":  # Play: the highlight walks a layer per step
                self.light_layer((self.played + 1) % max(self.dash.session.lm.info.layers, 1))

    def light_layer(self, index: int) -> None:
        """Light layer `index` of the stack (amber), the opened one staying blue."""
        stack = next((t for t in self.fig.data if t.name == "layers"), None)
        if stack is not None:
            self.played = index
            stack.marker.color = plots.stack_colors(len(stack.y), self.opened, index)

    def steps_reset(self, steps) -> None:
        self.measured = None
        if self.live:
            self.refresh()

    def step_selected(self, index) -> None:
        self.measured = None
        if self.live:
            self.refresh()

    def session_changed(self) -> None:
        self.measured, self.opened, self._key = None, 0, None

    def flush(self) -> None:
        """Before an export: redraw a picture drawn for another step (never the first draw: the
        dashboard flushes every tab before display, and this one draws only once shown)."""
        if self.live or (self.drawn is not None and self.drawn != self.dash.shown_index()):
            self.refresh()

    def set_busy(self, busy: bool) -> None:
        self.parts["step-measure"].disabled = busy
        self.parts["step-walk"].disabled = busy

    # --- views ---

    def step(self):
        index = self.dash.shown_index()
        return None if index is None else self.dash.session.steps[index]

    def peaks(self):
        if self.chip.value == HERE:
            return self.dash.peaks()
        return chip_peaks_for(self.chip.value)

    def modelled_rows(self, step) -> tuple[list[dict], str]:
        """The step's operators timed at the chosen roofs, and a note ("" when all is drawn)."""
        lm, peaks = self.dash.session.lm, self.peaks()
        if peaks is None:
            return [], "No measured peaks for this machine yet: pick a chip to model the roofs."
        try:
            table = step_table(lm.info, step, fused=fused_attention(lm.model))
        except UnknownFamily as err:  # draw what can be drawn, and say so
            table = coarse_operators(lm.info, batch=step.batch_size, tokens_fed=step.tokens_fed,
                                     context_len=step.context_len)  # fmt: skip
            return timed(table, peaks), str(err)
        return timed(table, peaks), ""

    def refresh(self) -> None:
        """Redraw the picture and the roofline for the step in view."""
        step, note = self.step(), ""
        rows: list[dict] = []
        if step is not None:
            rows, note = self.modelled_rows(step)
            if self.measured is not None and self.measured["step"] == step.index:
                rows = self.measured["rows"]
        self.rows, self.drawn = rows, None if step is None else step.index
        self.draw(step, rows, note)

    def draw(self, step, rows: list[dict], note: str) -> None:
        """Restyle the boxes in place when the picture's structure is the one drawn (a next step of
        the same model: one small message per figure); otherwise build both figures anew."""
        info = self.dash.session.lm.info
        where = self.chip.value if self.chip.value != HERE else "this machine"
        kind = "measured + modelled" if rows and "measured_s" in rows[0] else "modelled"
        title = "" if step is None else (
            f"{info.name}: step {step.index} ({step.phase}, B={step.batch_size}, fed "
            f"{step.tokens_fed}, context {step.context_len})<br>at the roofs of {where} ({kind})")  # fmt: skip
        routed = self.routed(step)
        peaks = self.peaks() if rows else None
        key = (tuple(r["name"] for r in rows), info.layers, self.opened, note, self.chip.value,
               None if routed is None else tuple(routed["touched"]))  # fmt: skip
        if rows and key == self._key:
            self._restyle(self.fig, plots.box_update(rows, layers=info.layers), title)
            self._restyle(self.roof, plots.ops_roofline_update(rows, peaks), None)
        else:
            fig = plots.step_figure(rows, title=title, layers=info.layers, opened=self.opened,
                                    routed=routed, note=note)  # fmt: skip
            plots.redraw(self.fig, fig)
            self._wire_clicks()
            roof = plots.ops_roofline_figure(rows, peaks, title="Operators roofline")
            plots.redraw(self.roof, roof)
        self._key = key
        self.text.value = self.caption(rows, note)

    @staticmethod
    def _restyle(fig, values: dict, title: str | None) -> None:
        with fig.batch_update():
            for trace in fig.data:
                name = "roofs" if trace.name.startswith("roofs") else trace.name
                if name in values:
                    trace.update(values[name])
            if title is not None:
                fig.layout.title.text = title

    def caption(self, rows: list[dict], note: str) -> str:
        if not rows or note:
            return note or "Take a step to draw it."
        layer = {r["name"] for r in rows if r["stage"] == "layer"}
        top = sorted(rows, key=lambda r: -(r.get("measured_s") or r["time_s"]))[:3]
        tops = ", ".join(f"{r['name']} ({r.get('measured_bound') or r['bound']})" for r in top)
        return f"{len(layer)} operators per layer; the top three by time: {tops}."

    def routed(self, step) -> dict | None:
        """The experts step `step` touched in the opened layer, as recorded when it ran
        (Step.routing; None: a dense model, or a step that recorded no routing)."""
        info = self.dash.session.lm.info
        if step is None or not info.num_experts:
            return None
        layers = (step.routing or {}).get("layers") or []
        rec = next((r for r in layers if r.get("layer") == self.opened), None)
        if rec is None:
            return None
        return {"num_experts": info.num_experts, "touched": rec["touched"]}

    def _wire_clicks(self) -> None:
        for trace in self.fig.data:
            if trace.name == "layers":
                trace.on_click(self._layer_clicked)
            elif trace.name == "operators":
                trace.on_click(self._box_clicked)

    def _box_clicked(self, trace, points, state) -> None:
        """The attention box opens the attention per head (Inside tab), the head or a sampling
        stage the step's distribution (the side panel)."""
        if not points.point_inds:
            return
        name = trace.customdata[points.point_inds[0]]
        if name in ATTENTION_OPS:
            names = [t.name for t in self.dash.tab_list]
            self.dash.parts["tabs"].selected_index = names.index("inside")
            self.dash.parts["inside-attention-run"].click()
        elif (name == "lm_head" or name.startswith("sampling/")) and self.drawn is not None:
            self.dash.select(self.drawn)

    def _layer_clicked(self, trace, points, state) -> None:
        if points.point_inds:
            self.open_layer(points.point_inds[0])

    def open_layer(self, index: int) -> None:
        """Open layer `index` in the picture (its experts, for an MoE)."""
        self.opened = int(index)
        self.draw(self.step(), self.rows, "")

    def walk(self) -> None:
        """Light each layer of the stack in turn (the step's path through the model), then none."""
        stack = next((t for t in self.fig.data if t.name == "layers"), None)
        if stack is None:
            return
        n, self.walked = len(stack.y), []
        for i in [*range(n), None]:
            stack.marker.color = plots.stack_colors(n, self.opened, i)
            self.walked.append(i)
            time.sleep(self.walk_delay if i is not None else 0)

    def measure(self) -> None:
        """Profile the step in view per operator and redraw with its measured times."""
        step = self.step()
        if step is None:
            self.dash.guard.say("Take a step first: Measure profiles a step that ran.", "warn")
            return
        self.measured = profile_session_ops(self.dash.session, step.index)
        self.refresh()
        self.dash.guard.say(
            f"Measured step {self.measured['step']} per operator ({self.measured['timing']}).", "ok"
        )
