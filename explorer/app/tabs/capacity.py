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


def whatif_defaults(chip: str | None = None) -> dict:
    """The what-if's defaults (on `chip`: with its chip family's fitted values)."""
    from explorer.serving.simulate.whatif import DEFAULTS

    if chip is None:
        return DEFAULTS
    from explorer.costs.hardware import chip_named
    from explorer.serving.simulate.whatif_settings import defaults_for

    return defaults_for(chip_named(chip).name)


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


def build() -> tuple[W.Widget, dict]:
    """The tab's widget and its parts (name -> widget, CSS class ie-<name>); no callbacks."""
    parts: dict = {}
    box = labelled(parts, "cap", "105px")
    shapes = _shapes()
    default = "arch:llama-3.1-8b" if "arch:llama-3.1-8b" in shapes else shapes[0]
    box(W.Dropdown, "model", default, "model shape", "280px", options=shapes)
    box(W.Dropdown, "chip", "h100", "chip", options=_chips())
    box(W.IntText, "gpus", 1, "GPUs (TP)")
    box(W.Dropdown, "engine", "continuous", "scheduler", options=_engines())
    parts["cap-replicas"] = control(deployment_specs()["replicas"], 1, "cap-replicas")
    check = box(W.IntText, "check", check_prompts(), "requests / seed")
    check.tooltip = (
        "a rate is accepted only where runs of this many requests, one per seed, are "
        "stable and meet the SLOs (8,000 by default; fewer: faster, less sure)"
    )
    box(W.Checkbox, "ep", False, "split experts (EP)", indent=False)
    box(W.Dropdown, "dtype", "bfloat16", "dtype", "215px", options=WEIGHT_DTYPES)
    box(W.IntText, "input", 512, "prompt tokens")
    box(W.IntText, "output", 128, "output tokens")
    box(W.Text, "slos", "ttft:500 tpot:50", "SLOs p99 (ms)", "280px")
    box(W.FloatText, "price", 2.5, "$ / GPU-hour")
    fitted = whatif_defaults(parts["cap-chip"].value)
    box(W.FloatText, "bw-eff", fitted["bw_efficiency"], "bandwidth eff.")
    box(W.FloatText, "flop-eff", fitted["flop_efficiency"], "FLOP eff.")
    _buttons(parts, box)
    parts["cap-answer"] = tagged(W.HTML(value=""), "cap-answer")
    parts["cap-chart"] = figure_widget(plots.placeholder_figure, "Latency vs throughput (modelled)")
    parts["cap-chart"].add_class("ie-cap-chart")
    parts["cap-comparison"] = tagged(W.HTML(value=""), "cap-comparison")
    rows = (
        ("model", "chip", "gpus", "replicas", "dtype"),
        ("input", "output", "slos", "price", "check"),
        ("engine", "bw-eff", "flop-eff", "ep", "run"),
    )
    widget = W.VBox(
        [W.HBox([parts[f"cap-{n}"] for n in row]) for row in rows]
        + [parts["cap-answer"], parts["cap-chart"]]
        + [W.HBox([parts["cap-measured"], parts["cap-compare"]]), parts["cap-comparison"]]
    )
    widget.add_class("ie-capacity")
    parts["capacity"] = widget
    return widget, parts


def _buttons(parts: dict, box) -> None:
    """Run (the capacity search), the measured-result box and Compare."""
    parts["cap-run"] = button(
        "cap-run", "Run", "play", "primary", "simulate a range of request rates (modelled)"
    )
    box(W.Text, "measured", "", "measured JSON", "420px",
        placeholder="a vllm bench serve --save-result file (or ours)")  # fmt: skip
    parts["cap-compare"] = button(
        "cap-compare",
        "Compare",
        "balance-scale",
        tip="simulate that file's workload on this setup; show the error",
        width=None,
    )


def busy(button, work) -> None:
    """Run work() with `button` showing that it runs (a spinner, off), as the other tabs'
    runs show theirs."""
    label, icon = button.description, button.icon
    button.description, button.icon, button.disabled = "Running…", "spinner", True
    try:
        work()
    finally:
        button.description, button.icon, button.disabled = label, icon, False


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
        self.widget, self.parts = build()
        p, g = self.parts, dash.guard
        p["cap-run"].on_click(lambda _: g.call("the capacity run", busy, p["cap-run"], self.run))
        p["cap-compare"].on_click(
            lambda _: g.call("the comparison", busy, p["cap-compare"], self.compare)
        )
        p["cap-chip"].observe(self._chip_defaults, names="value")

    def _chip_defaults(self, change) -> None:
        """The efficiency boxes take the chosen chip family's fitted values."""
        fitted = whatif_defaults(change["new"])
        self.parts["cap-bw-eff"].value = fitted["bw_efficiency"]
        self.parts["cap-flop-eff"].value = fitted["flop_efficiency"]

    def value(self, name: str):
        """The value of the control cap-<name>."""
        return self.parts[f"cap-{name}"].value

    def figures(self):
        return [self.parts["cap-chart"]]

    def export_figures(self) -> dict:
        return {"capacity": self.parts["cap-chart"]}

    def set_busy(self, busy: bool) -> None:
        self.parts["cap-run"].disabled = self.parts["cap-compare"].disabled = busy

    def compare(self) -> None:
        """The model's error against a measured result of the same setup: its workload (rate,
        request count, median lengths) simulated on the chosen chip and GPU count."""
        from explorer.serving.simulate.whatif import simulate_measured

        path = self.value("measured").strip()
        if not path:
            raise ValueError("give the path of a measured result JSON first")
        rows = simulate_measured(
            self._info(),
            path,
            self.value("chip"),
            self.value("gpus"),
            bw_efficiency=self.value("bw-eff"),
            flop_efficiency=self.value("flop-eff"),
            dtype=self.value("dtype"),
            expert_parallel=self.value("ep"),
        )
        cells = "".join(
            f"<tr><td>{r['metric']}</td><td>{number(r['measured'])}</td>"
            f"<td>{number(r['simulated'])}</td><td>{pct(r['error_pct'], '+.1f')}</td></tr>"
            for r in rows
        )
        self.parts["cap-comparison"].value = (
            f"<table style='font-size:11px'><tr><th>metric</th><th>measured</th>"
            f"<th>modelled</th><th>error</th></tr>{cells}</table>"
        )
        self.dash.guard.say(f"Compared the model with {html.escape(path)}.", "ok")

    def _info(self):
        from explorer.model.loader import arch_info

        built = "bfloat16" if self.value("dtype") == "fp8" else self.value("dtype")
        return arch_info(self.value("model"), built)

    def run(self) -> None:
        """Simulate the curve and show the answer (errors go to the dashboard's message)."""
        from explorer.serving import parse_goodput
        from explorer.serving.simulate.capacity import capacity, curve

        slos = parse_goodput(self.value("slos").strip() or None)
        for name, w, low in (
            ("prompt tokens", self.parts["cap-input"], 1),
            ("output tokens", self.parts["cap-output"], 2),
        ):
            if w.value < low:
                raise ValueError(f"{name} must be >= {low}, got {w.value}")
        replicas = self.value("replicas")
        why = deployment_specs()["replicas"].problem(replicas)
        if why:
            raise ValueError(f"replicas {why}")
        if not isinstance(self.value("check"), int) or self.value("check") < 1:
            raise ValueError(
                f"requests / seed must be a whole number >= 1, got {self.value('check')}"
            )
        info = self._info()
        self.dash.guard.say(
            f"Simulating {info.name} on {replicas} x {self.value('gpus')} x {self.value('chip')}…",
            "busy",
        )
        setup = dict(
            tp=self.value("gpus"),
            replicas=replicas,
            input_len=self.value("input"),
            output_len=self.value("output"),
            slos=slos,
            bw_efficiency=self.value("bw-eff"),
            flop_efficiency=self.value("flop-eff"),
            dtype=self.value("dtype"),
            expert_parallel=self.value("ep"),
            engine=self.value("engine"),
        )
        rows = curve(info, self.value("chip"), **setup)
        best = (
            capacity(info, self.value("chip"), check_prompts=self.value("check"), **setup)
            if slos
            else None
        )
        self.rows = rows
        plots.redraw(self.parts["cap-chart"], plots.capacity_figure(rows, slos))
        refit(self.parts["cap-chart"])
        verdict = self._verdict(best, replicas)
        items = "".join(f"<li>{html.escape(a)}</li>" for a in rows[0]["assumptions"])
        self.parts["cap-answer"].value = (
            f"<div>{verdict} (modelled)</div><details><summary>assumptions</summary>"
            f"<ul style='font-size:11px'>{items}</ul></details>"
            f"{_published_html(self.value('engine'), self.value('chip'))}"
        )
        self.dash.guard.say(f"Capacity curve: {len(rows)} simulated rates (modelled).", "ok")

    def _verdict(self, best: dict | None, replicas: int) -> str:
        from explorer.serving.simulate.capacity import cost_per_million

        if best is None or best["largest_rate"] is None:
            verdict = (
                "no SLOs given: give some (e.g. ttft:500 tpot:50) for a largest rate"
                if best is None
                else (
                    best.get("refused") or "not even the lowest rate is steady and meets the SLOs"
                )
                + ": more GPUs, a faster chip or looser SLOs"
            )
        else:
            cost = cost_per_million(best, self.value("gpus") * replicas, self.value("price"))
            verdict = (
                f"largest steady rate meeting the SLOs: <b>{best['largest_rate']:.3g} req/s</b> "
                f"(utilization {best['utilization']:.2f} of the modelled capacity "
                f"{best['capacity_rps_modelled']:.3g} req/s; {best['output_throughput']:.0f} output "
                f"tok/s, p99 TTFT {best['p99_ttft_ms']:.0f} ms, p99 TPOT "
                f"{best['p99_tpot_ms']:.1f} ms; goodput, the requests meeting every SLO per second "
                f"of the whole run, first arrival to last finish, "
                f"{best['request_goodput'] or 0:.3g} req/s), "
                f"about <b>${cost:.3f} per million output tokens</b> at "
                f"${self.value('price'):g}/GPU-hour for {replicas * self.value('gpus')} GPU(s); "
                "held on "
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
