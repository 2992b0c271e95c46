"""The Capacity tab: how many GPUs for this model, workload and SLOs? Modelled, on paper.

Pick a model shape, a chip, the GPU count (tensor parallel), the request lengths, the SLOs and an
hourly price: Run simulates a range of Poisson request rates (explorer.serving.simulate.capacity)
and draws p99 TTFT and TPOT against throughput with the SLOs, then says the largest rate that
meets them, its goodput and the cost per million output tokens. Every figure is modelled and the
assumptions are listed beside it. Compare loads a measured result JSON (vllm bench serve
--save-result, or ours), simulates its workload on the chosen setup and shows the error per metric;
`explorer simulate --validate` shows the simulator's error against measurement on this machine.
Any error is a message; the last curve and comparison stay.
"""

from __future__ import annotations

import html

import ipywidgets as W

from explorer import plots
from explorer.app.controls import labelled, tagged
from explorer.app.tabs import Tab, register
from explorer.app.views import figure_widget, refit

CHIPS = ("h100", "h200", "a100", "mi300x", "l4")


def _shapes() -> list[str]:
    from explorer.model.loader import available_models

    return [m for m in available_models() if m.startswith("arch:")]


@register(47)
class CapacityTab(Tab):
    name, title = "capacity", "Capacity"
    about = (
        "How many GPUs do I need? A serving simulator on paper: the chip table's bandwidth and "
        "FLOP/s x an efficiency, the KV memory limit, tensor parallelism with its all-reduces, "
        "transformers' continuous-batching policy. Each point is one request rate: read across to "
        "its throughput, up to its p99 latency; filled points meet the SLOs. Everything here is "
        "<b>modelled</b>; <code>explorer simulate --validate</code> shows the simulator's error "
        "against measurement on this machine."
    )

    def __init__(self, dash):
        super().__init__(dash)
        self.rows: list[dict] = []

        box = labelled(self.parts, "cap", "105px")

        shapes = _shapes()
        default = "arch:llama-3.1-8b" if "arch:llama-3.1-8b" in shapes else shapes[0]
        self.model = box(W.Dropdown, "model", default, "model shape", "280px", options=shapes)
        self.chip = box(W.Dropdown, "chip", "h100", "chip", options=list(CHIPS))
        self.gpus = box(W.IntText, "gpus", 1, "GPUs (TP)")
        self.dtype = box(
            W.Dropdown, "dtype", "bfloat16", "dtype", "215px", options=["bfloat16", "float16"]
        )
        self.input_len = box(W.IntText, "input", 512, "prompt tokens")
        self.output_len = box(W.IntText, "output", 128, "output tokens")
        self.slos = box(W.Text, "slos", "ttft:500 tpot:50", "SLOs p99 (ms)", "280px")
        self.price = box(W.FloatText, "price", 2.5, "$ / GPU-hour")
        self.bw_eff = box(W.FloatText, "bw-eff", 0.75, "bandwidth eff.")
        self.flop_eff = box(W.FloatText, "flop-eff", 0.6, "FLOP eff.")
        self.run_button = tagged(
            W.Button(
                description="Run",
                icon="play",
                button_style="primary",
                tooltip="simulate a range of request rates (modelled)",
            ),
            "cap-run",
        )
        self.run_button.on_click(
            lambda _: self.dash.guard.call("the capacity run", self.busy, self.run_button, self.run)
        )
        self.measured = box(
            W.Text,
            "measured",
            "",
            "measured JSON",
            "420px",
            placeholder="a vllm bench serve --save-result file (or ours)",
        )
        self.compare_button = tagged(
            W.Button(
                description="Compare",
                icon="balance-scale",
                tooltip="simulate that file's workload on this setup; show the error",
            ),
            "cap-compare",
        )
        self.compare_button.on_click(
            lambda _: self.dash.guard.call(
                "the comparison", self.busy, self.compare_button, self.compare
            )
        )
        self.answer = tagged(W.HTML(value=""), "cap-answer")
        self.chart = figure_widget(plots.placeholder_figure, "Latency vs throughput (modelled)")
        self.chart.add_class("ie-cap-chart")
        self.comparison = tagged(W.HTML(value=""), "cap-comparison")
        self.parts.update(
            {
                "cap-run": self.run_button,
                "cap-answer": self.answer,
                "cap-chart": self.chart,
                "cap-compare": self.compare_button,
                "cap-comparison": self.comparison,
            }
        )
        self.widget = W.VBox(
            [
                W.HBox([self.model, self.chip, self.gpus, self.dtype]),
                W.HBox([self.input_len, self.output_len, self.slos, self.price]),
                W.HBox([self.bw_eff, self.flop_eff, self.run_button]),
                self.answer,
                self.chart,
                W.HBox([self.measured, self.compare_button]),
                self.comparison,
            ]
        )
        self.widget.add_class("ie-capacity")
        self.parts["capacity"] = self.widget

    def figures(self):
        return [self.chart]

    def export_figures(self) -> dict:
        return {"capacity": self.chart}

    def busy(self, button, work) -> None:
        """Run work() with `button` showing that it runs (a spinner, off), as the other tabs'
        runs show theirs."""
        label, icon = button.description, button.icon
        button.description, button.icon, button.disabled = "Running…", "spinner", True
        try:
            work()
        finally:
            button.description, button.icon, button.disabled = label, icon, False

    def set_busy(self, busy: bool) -> None:
        self.run_button.disabled = self.compare_button.disabled = busy

    def compare(self) -> None:
        """The model's error against a measured result of the same setup: its workload (rate,
        request count, median lengths) simulated on the chosen chip and GPU count."""
        from explorer.serving.simulate.whatif import simulate_measured

        path = self.measured.value.strip()
        if not path:
            raise ValueError("give the path of a measured result JSON first")
        rows = simulate_measured(
            self._info(),
            path,
            self.chip.value,
            self.gpus.value,
            bw_efficiency=self.bw_eff.value,
            flop_efficiency=self.flop_eff.value,
        )
        cells = "".join(
            f"<tr><td>{r['metric']}</td><td>{_f(r['measured'])}</td>"
            f"<td>{_f(r['simulated'])}</td><td>{_pct(r['error_pct'])}</td></tr>"
            for r in rows
        )
        self.comparison.value = (
            f"<table style='font-size:11px'><tr><th>metric</th><th>measured</th>"
            f"<th>modelled</th><th>error</th></tr>{cells}</table>"
        )
        self.dash.guard.say(f"Compared the model with {html.escape(path)}.", "ok")

    def _info(self):
        from explorer.model.loader import arch_info

        return arch_info(self.model.value, self.dtype.value)

    def run(self) -> None:
        """Simulate the curve and show the answer (errors go to the dashboard's message)."""
        from explorer.serving import parse_goodput
        from explorer.serving.simulate.capacity import cost_per_million, curve, largest_rate

        slos = parse_goodput(self.slos.value.strip() or None)
        for name, w, low in (
            ("prompt tokens", self.input_len, 1),
            ("output tokens", self.output_len, 2),
        ):
            if w.value < low:
                raise ValueError(f"{name} must be >= {low}, got {w.value}")
        info = self._info()
        self.dash.guard.say(
            f"Simulating {info.name} on {self.gpus.value} x {self.chip.value}…", "busy"
        )
        rows = curve(
            info,
            self.chip.value,
            tp=self.gpus.value,
            input_len=self.input_len.value,
            output_len=self.output_len.value,
            slos=slos,
            bw_efficiency=self.bw_eff.value,
            flop_efficiency=self.flop_eff.value,
        )
        self.rows = rows
        plots.redraw(self.chart, plots.capacity_figure(rows, slos))
        refit(self.chart)
        best = largest_rate(rows)
        if best is None:
            verdict = (
                "not even the lowest rate meets the SLOs: more GPUs, a faster chip or looser SLOs"
            )
        else:
            cost = cost_per_million(best, self.gpus.value, self.price.value)
            verdict = (
                f"largest rate meeting the SLOs: <b>{best['request_rate']:.3g} req/s</b> "
                f"offered ({best['output_throughput']:.0f} output tok/s; goodput, the requests "
                f"meeting every SLO, {best['request_goodput'] or 0:.3g} req/s: it counts per "
                "second of the whole run, first arrival to last finish, so it sits below the "
                f"offered rate), about <b>${cost:.3f} per million "
                f"output tokens</b> at ${self.price.value:g}/GPU-hour"
            )
        items = "".join(f"<li>{html.escape(a)}</li>" for a in rows[0]["assumptions"])
        self.answer.value = (
            f"<div>{verdict} (modelled)</div><details><summary>assumptions</summary>"
            f"<ul style='font-size:11px'>{items}</ul></details>"
        )
        self.dash.guard.say(f"Capacity curve: {len(rows)} simulated rates (modelled).", "ok")


def _f(v) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def _pct(v) -> str:
    return "n/a" if v is None else f"{v:+.1f}%"
