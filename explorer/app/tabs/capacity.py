"""The Capacity tab: how many GPUs for this model, workload and SLOs? Modelled, on paper.

Pick a model shape, a chip, the GPU count (tensor parallel) and the replicas behind a load
balancer (the declared Deployment setting, explorer.serving.simulate.whatif_settings), the request
lengths, the SLOs and an
hourly price: Run simulates a range of Poisson request rates (explorer.serving.simulate.capacity)
and draws p99 TTFT and TPOT against throughput with the SLOs, each point labelled with its
utilization (unstable points, past saturation, as crosses), then searches the largest steady rate
that meets them and says it, its goodput and the cost per million output tokens. Every figure is modelled and the
assumptions are listed beside it. Compare loads a measured result JSON (vllm bench serve
--save-result, or ours), simulates its workload on the chosen setup and shows the error per metric;
`explorer simulate --validate` shows the simulator's error against measurement on this machine.
Any error is a message; the last curve and comparison stay.
"""

from __future__ import annotations

import html

import ipywidgets as W

from explorer import plots
from explorer._format import number, pct
from explorer.app.controls import button, control, labelled, tagged
from explorer.app.tabs import Tab, register
from explorer.app.views import figure_widget, refit


def _chips() -> list[str]:
    """The chip table's GPUs with a memory figure and a 16-bit matrix figure (short names)."""
    from explorer.costs.hardware import KNOWN_CHIPS

    return [c.short_name for c in KNOWN_CHIPS.values() if c.memory_gb and c.bf16_tflops]


def whatif_defaults() -> dict:
    from explorer.serving.simulate.whatif import DEFAULTS

    return DEFAULTS


def deployment_specs() -> dict:
    from explorer.engine.settings import specs
    from explorer.serving.simulate.whatif_settings import Deployment

    return specs(Deployment)


def check_prompts() -> int:
    from explorer.serving.simulate.capacity import CHECK_PROMPTS

    return CHECK_PROMPTS


def _engines() -> list[str]:
    """The schedulers the what-if runs on a chip (the lab's continuous, the served engines')."""
    from explorer.serving.simulate.policy import POLICIES, modelled

    return [n for n in modelled() if POLICIES.get(n).on_paper]


def _shapes() -> list[str]:
    from explorer.model.loader import available_models

    return [m for m in available_models() if m.startswith("arch:")]


WEIGHT_DTYPES = ["bfloat16", "float16", "fp8"]  # the weights the what-if prices on a chip


@register(47)
class CapacityTab(Tab):
    name, title = "capacity", "Capacity"
    about = (
        "How many GPUs do I need? A serving simulator on paper: the chip table's bandwidth and "
        "FLOP/s x an efficiency, the KV memory limit, tensor parallelism with its all-reduces, "
        "the scheduler picked (transformers' continuous batching, or vLLM V1 / V0, SGLang, "
        "TensorRT-LLM as their sources schedule); a mixture of experts reads the experts each "
        "iteration's tokens touch. Each point is one request rate: read across to "
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
        self.chip = box(W.Dropdown, "chip", "h100", "chip", options=_chips())
        self.gpus = box(W.IntText, "gpus", 1, "GPUs (TP)")
        self.engine = box(W.Dropdown, "engine", "continuous", "scheduler", options=_engines())
        self.replicas, self.check = self._deployment_controls(box)
        self.expert_parallel = box(W.Checkbox, "ep", False, "split experts (EP)", indent=False)
        self.dtype = box(W.Dropdown, "dtype", "bfloat16", "dtype", "215px", options=WEIGHT_DTYPES)
        self.input_len = box(W.IntText, "input", 512, "prompt tokens")
        self.output_len = box(W.IntText, "output", 128, "output tokens")
        self.slos = box(W.Text, "slos", "ttft:500 tpot:50", "SLOs p99 (ms)", "280px")
        self.price = box(W.FloatText, "price", 2.5, "$ / GPU-hour")
        fitted = whatif_defaults()
        self.bw_eff = box(W.FloatText, "bw-eff", fitted["bw_efficiency"], "bandwidth eff.")
        self.flop_eff = box(W.FloatText, "flop-eff", fitted["flop_efficiency"], "FLOP eff.")
        self._buttons(box)
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
                W.HBox([self.model, self.chip, self.gpus, self.replicas, self.dtype]),
                W.HBox([self.input_len, self.output_len, self.slos, self.price, self.check]),
                W.HBox(
                    [self.engine, self.bw_eff, self.flop_eff, self.expert_parallel, self.run_button]
                ),
                self.answer,
                self.chart,
                W.HBox([self.measured, self.compare_button]),
                self.comparison,
            ]
        )
        self.widget.add_class("ie-capacity")
        self.parts["capacity"] = self.widget

    def _buttons(self, box) -> None:
        """Run (the capacity search), the measured-result box and Compare, wired to the guard."""
        self.run_button = button(
            "cap-run", "Run", "play", "primary", "simulate a range of request rates (modelled)"
        )
        self.compare_button = button(
            "cap-compare",
            "Compare",
            "balance-scale",
            tip="simulate that file's workload on this setup; show the error",
            width=None,
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
        self.compare_button.on_click(
            lambda _: self.dash.guard.call(
                "the comparison", self.busy, self.compare_button, self.compare
            )
        )

    def _deployment_controls(self, box):
        """The replicas (the declared Deployment setting) and the check runs' length."""
        replicas = control(deployment_specs()["replicas"], 1, "cap-replicas")
        self.parts["cap-replicas"] = replicas
        check = box(W.IntText, "check", check_prompts(), "requests / seed")
        check.tooltip = (
            "a rate is accepted only where runs of this many requests, one per seed, are "
            "stable and meet the SLOs (8,000 by default; fewer: faster, less sure)"
        )
        return replicas, check

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
            dtype=self.dtype.value,
            expert_parallel=self.expert_parallel.value,
        )
        cells = "".join(
            f"<tr><td>{r['metric']}</td><td>{number(r['measured'])}</td>"
            f"<td>{number(r['simulated'])}</td><td>{pct(r['error_pct'], '+.1f')}</td></tr>"
            for r in rows
        )
        self.comparison.value = (
            f"<table style='font-size:11px'><tr><th>metric</th><th>measured</th>"
            f"<th>modelled</th><th>error</th></tr>{cells}</table>"
        )
        self.dash.guard.say(f"Compared the model with {html.escape(path)}.", "ok")

    def _info(self):
        from explorer.model.loader import arch_info

        built = "bfloat16" if self.dtype.value == "fp8" else self.dtype.value
        return arch_info(self.model.value, built)

    def run(self) -> None:
        """Simulate the curve and show the answer (errors go to the dashboard's message)."""
        from explorer.serving import parse_goodput
        from explorer.serving.simulate.capacity import capacity, curve

        slos = parse_goodput(self.slos.value.strip() or None)
        for name, w, low in (
            ("prompt tokens", self.input_len, 1),
            ("output tokens", self.output_len, 2),
        ):
            if w.value < low:
                raise ValueError(f"{name} must be >= {low}, got {w.value}")
        replicas = self.replicas.value
        why = deployment_specs()["replicas"].problem(replicas)
        if why:
            raise ValueError(f"replicas {why}")
        if not isinstance(self.check.value, int) or self.check.value < 1:
            raise ValueError(f"requests / seed must be a whole number >= 1, got {self.check.value}")
        info = self._info()
        self.dash.guard.say(
            f"Simulating {info.name} on {replicas} x {self.gpus.value} x {self.chip.value}…",
            "busy",
        )
        setup = dict(
            tp=self.gpus.value,
            replicas=replicas,
            input_len=self.input_len.value,
            output_len=self.output_len.value,
            slos=slos,
            bw_efficiency=self.bw_eff.value,
            flop_efficiency=self.flop_eff.value,
            dtype=self.dtype.value,
            expert_parallel=self.expert_parallel.value,
            engine=self.engine.value,
        )
        rows = curve(info, self.chip.value, **setup)
        best = (
            capacity(info, self.chip.value, check_prompts=self.check.value, **setup)
            if slos
            else None
        )
        self.rows = rows
        plots.redraw(self.chart, plots.capacity_figure(rows, slos))
        refit(self.chart)
        verdict = self._verdict(best, replicas)
        items = "".join(f"<li>{html.escape(a)}</li>" for a in rows[0]["assumptions"])
        self.answer.value = (
            f"<div>{verdict} (modelled)</div><details><summary>assumptions</summary>"
            f"<ul style='font-size:11px'>{items}</ul></details>"
            f"{_published_html(self.engine.value, self.chip.value)}"
        )
        self.dash.guard.say(f"Capacity curve: {len(rows)} simulated rates (modelled).", "ok")

    def _verdict(self, best: dict | None, replicas: int) -> str:
        from explorer.serving.simulate.capacity import cost_per_million

        if best is None or best["largest_rate"] is None:
            verdict = (
                "no SLOs given: give some (e.g. ttft:500 tpot:50) for a largest rate"
                if best is None
                else "not even the lowest rate is steady and meets the SLOs: more GPUs, a "
                "faster chip or looser SLOs"
            )
        else:
            cost = cost_per_million(best, self.gpus.value * replicas, self.price.value)
            verdict = (
                f"largest steady rate meeting the SLOs: <b>{best['largest_rate']:.3g} req/s</b> "
                f"(utilization {best['utilization']:.2f} of the modelled capacity "
                f"{best['capacity_rps_modelled']:.3g} req/s; {best['output_throughput']:.0f} output "
                f"tok/s, p99 TTFT {best['p99_ttft_ms']:.0f} ms, p99 TPOT "
                f"{best['p99_tpot_ms']:.1f} ms; goodput, the requests meeting every SLO per second "
                f"of the whole run, first arrival to last finish, "
                f"{best['request_goodput'] or 0:.3g} req/s), "
                f"about <b>${cost:.3f} per million output tokens</b> at "
                f"${self.price.value:g}/GPU-hour for {replicas * self.gpus.value} GPU(s); held on "
                f"{best['num_prompts']:,}-request runs with seeds "
                f"{', '.join(str(r['seed']) for r in best['seed_runs'] or [])}"
            )
        return verdict


def _published_html(engine: str = "continuous", chip: str = "h100") -> str:
    """How far the what-if was from published GPU runs (the stored comparison): the row of the
    report for this scheduler on this chip (published_report.matching_row), then the table."""
    from explorer.serving.simulate.published import validation_summary
    from explorer.serving.simulate.published_report import REPORTED, matching_row

    s = validation_summary(compute=False)
    if s is None:
        return "<div>no stored comparison with published runs</div>"
    row = matching_row(s.get("report") or {}, engine, chip)
    if row is None:
        match = (
            f"<div>no published run used the {html.escape(engine)} scheduler on "
            f"{html.escape(chip)}: the errors below are over other engines and chips</div>"
        )
    else:
        errs = ", ".join(
            f"{h} {pct(row['median_abs_error_pct'][m])} ({row['n'][m]})"
            for m, h in REPORTED.items()
            if row["n"][m]
        )
        match = (
            f"<div class='ie-cap-match'>published runs of <b>{html.escape(engine)} on "
            f"{html.escape(chip)}</b> ({row['split']}; {row['run']} run, {row['unsupported']} "
            f"unsupported): median |error| {errs}</div>"
        )
    cells = "".join(
        f"<tr><td>{x['metric']}</td><td>{pct(x['fitted'])} ({x['n_fitted']})</td>"
        f"<td>{pct(x['held_out'])} ({x['n_held_out']})</td></tr>"
        for x in s["summary"]
    )
    return (
        f"{match}<details><summary>how far this model was from published GPU runs (median "
        f"|error|; fitted on {', '.join(s['fit_sources'])}, held out "
        f"{', '.join(s['held_out_sources'])})</summary><table style='font-size:11px'><tr>"
        f"<th>metric</th><th>fitted (runs)</th><th>held out (runs)</th></tr>{cells}</table>"
        f"</details>"
    )
