"""The Serving tab: a small workload through one engine on the dashboard's model (explorer.serving).

Engine, arrivals, rate, concurrency, lengths and SLOs are widgets, and each engine knob's control
is built from the engine's Knobs declaration (shown while that engine is chosen); Run serves the workload on a
background thread (the kernel stays responsive; Stop keeps the requests that finished) and draws
the request Gantt, the ITL timeline with prefill iterations shaded, the latency CDFs of the last
runs side by side, and the engine's own batch and KV-cache state. Any error is a message; the
settings and the last run's views stay as they were.

Seeing it break: a scenario picker runs one of explorer.serving.scenarios (a named, seeded failure
and its fix) on the same thread-and-Stop pattern and shows the broken run beside the fixed one on
the same charts (plots.scenario_figure), with the verdict, the why and the evidence; a stopped
scenario keeps what finished, marked partial.
"""

from __future__ import annotations

import html
import time

import ipywidgets as W

from explorer import plots
from explorer._format import ms_value, text
from explorer.app.controls import control, labelled, read_control, tagged
from explorer.app.export import download_link
from explorer.app.runner import Runner
from explorer.app.tabs import Tab, register
from explorer.app.views import figure_widget, refit
from explorer.serving import engines

ARRIVALS = {
    "all at once": "burst",
    "Poisson": "poisson",
    "gamma (burstiness)": "gamma",
    "fixed interval": "fixed",
}
KEEP = 3  # runs whose CDFs are drawn together
VIEWS = (
    ("gantt", "Requests over time"),
    ("itl", "Inter-token latency"),
    ("cdf", "Latency CDFs"),
    ("state", "Inside the engine"),
)
BUTTONS = ("serve-run", "serve-stop", "serve-summary", "serving")  # parts that are not settings
SCEN_PARTS = ("scen-name", "scen-run", "scen-stop", "scen-about", "scen-verdict", "scen-chart")
SCEN_INTRO = (
    " Production failures on the loaded model: each scenario serves a workload twice, broken "
    "and fixed, and reads what broke from the records. Predict what breaks first, then run it."
)
INTRO = (
    "Many requests on one machine, measured on the loaded model: static batches wait for their "
    "longest request; continuous batching (transformers' own engine) lets requests join and "
    "leave every iteration. TTFT, TPOT, ITL and goodput follow vLLM's definitions."
)


def knob_part(knob: str) -> str:
    """The part (and CSS class ie-<part>) of an engine knob's control."""
    return f"serve-{knob.replace('_', '-')}"


def knob_controls(engine_names: tuple[str, ...]) -> dict[str, W.Widget]:
    """One control per knob of these engines, from their Knobs declarations."""
    out = {}
    for knob, (spec, default, _) in engines.knob_table(engine_names).items():
        w = control(spec, default, knob_part(knob))
        w.layout, w.style = W.Layout(width="190px"), {"description_width": "100px"}
        out[knob_part(knob)] = w
    return out


def read_knobs(parts: dict, engine: str) -> engines.Knobs:
    """The engine's validated Knobs from its controls (ValueError naming the knob and its range)."""
    knobs = engines.get(engine).Knobs
    return knobs(
        **{k: read_control(k, spec, parts[knob_part(k)]) for k, spec in knobs.specs().items()}
    )


def show_knobs(parts: dict, engine: str) -> None:
    """Show the controls of the knobs `engine` takes, hide the others."""
    taken = {knob_part(k) for k in engines.get(engine).Knobs.specs()}
    for knob in engines.knob_table(engines.names(local_only=True)):
        part = knob_part(knob)
        parts[part].layout.display = None if part in taken else "none"


def build() -> tuple[W.Widget, dict]:
    """The tab's widget and its parts (name -> widget, CSS class ie-<name>); no callbacks."""
    parts: dict = {}
    box = labelled(parts, "serve", "100px")
    local = engines.names(local_only=True)
    row1 = [
        box(W.Dropdown, "engine", "continuous", "engine", "260px", options=list(local)),
        box(W.Dropdown, "arrival", "all at once", "arrivals", "260px", options=list(ARRIVALS)),
        box(W.FloatText, "rate", 8.0, "rate (req/s)"),
        box(W.FloatText, "burstiness", 1.0, "burstiness"),
    ]
    row2 = [
        box(W.IntText, "requests", 16, "requests"),
        box(W.IntText, "input", 32, "prompt tokens"),
        box(W.IntText, "output", 16, "output tokens"),
        box(W.IntText, "concurrency", 0, "max in flight"),
    ]
    knobs = knob_controls(local)
    parts.update(knobs)
    slos = box(W.Text, "slos", "ttft:500 tpot:50", "SLOs (ms)", "260px")
    run = W.Button(description="Run", icon="play", button_style="primary")
    run.tooltip = "serve the workload on the loaded model"
    stop = W.Button(description="Stop", icon="stop", disabled=True)
    stop.tooltip = "stop the run (finished requests are kept)"
    parts["serve-run"], parts["serve-stop"] = tagged(run, "serve-run"), tagged(stop, "serve-stop")
    parts["serve-summary"] = tagged(W.HTML(value=""), "serve-summary")
    for key, title in VIEWS:
        chart = figure_widget(plots.placeholder_figure, title)
        chart.add_class(f"ie-serve-{key}")
        parts[f"serve-{key}"] = chart
    widget = W.VBox(
        [
            W.HTML(INTRO),
            W.HBox(row1),
            W.HBox(row2),
            W.HBox(list(knobs.values()), layout=W.Layout(flex_flow="row wrap")),
            W.HBox([slos, run, stop]),
            parts["serve-summary"],
            *(parts[f"serve-{key}"] for key, _ in VIEWS),
            build_scenarios(parts),
        ]
    )
    widget.add_class("ie-serving")
    parts["serving"] = widget
    return widget, parts


def build_scenarios(parts: dict) -> W.Widget:
    """The scenario picker: a failure scenario, Run and Stop, what it is, its verdict and its chart."""
    from explorer.serving import scenarios

    names = scenarios.names()
    pick = W.Dropdown(
        options=names,
        value=names[0],
        description="scenario",
        layout=W.Layout(width="300px"),
        style={"description_width": "70px"},
    )
    parts["scen-name"] = tagged(pick, "scen-name")
    run = W.Button(description="Run scenario", icon="play", button_style="danger")
    run.tooltip = "run the broken and the fixed serving runs on the loaded model"
    stop = W.Button(description="Stop", icon="stop", disabled=True)
    stop.tooltip = "stop the scenario (what finished is kept, marked partial)"
    parts["scen-run"], parts["scen-stop"] = tagged(run, "scen-run"), tagged(stop, "scen-stop")
    parts["scen-about"] = tagged(W.HTML(value=_about(pick.value)), "scen-about")
    parts["scen-verdict"] = tagged(W.HTML(value=""), "scen-verdict")
    chart = figure_widget(plots.placeholder_figure, "Broken vs fixed", "Run a scenario to draw it")
    chart.add_class("ie-scen-chart")
    parts["scen-chart"] = chart
    return W.VBox(
        [
            W.HTML("<h4 style='margin:12px 0 2px'>Seeing it break</h4>" + SCEN_INTRO),
            W.HBox([pick, run, stop]),
            parts["scen-about"],
            parts["scen-verdict"],
            chart,
        ]
    )


def _about(name: str) -> str:
    """What a scenario shows and its fix, from its registry entry (one line)."""
    from explorer.serving import scenarios

    sc = scenarios.get(name)
    return f"<i>{html.escape(sc.title)}; the fix: {html.escape(sc.fix)}</i>"


def wire(tab: ServingTab) -> None:
    """Run calls the tab (each Stop is its runner's); the engine's choice shows its knobs."""
    parts = tab.parts
    parts["serve-run"].on_click(lambda _: tab.start())
    parts["scen-run"].on_click(lambda _: tab.start_scenario())
    parts["scen-name"].observe(
        lambda change: setattr(parts["scen-about"], "value", _about(change["new"])), names="value"
    )
    engine = parts["serve-engine"]
    engine.observe(lambda change: show_knobs(parts, change["new"]), names="value")
    show_knobs(parts, engine.value)


@register(45)
class ServingTab(Tab):
    name, title = "serving", "Serving"
    about = (
        "How to read it: the Gantt has one row per request (grey: waiting, orange: prefill, blue: "
        "decode), time from the run's start; the ITL chart puts every gap between two tokens at "
        "the time it ended; the CDFs compare the last runs (left is better)."
    )

    def __init__(self, dash):
        super().__init__(dash)
        self.scenario = None  # the last ScenarioResult shown
        self.results: list = []  # the last KEEP ServingResults, newest last
        self._count = 0
        self.widget, self.parts = build()
        self.charts = {key: self.parts[f"serve-{key}"] for key, _ in VIEWS}
        inputs = [
            w
            for n, w in self.parts.items()
            if n not in BUTTONS
            and n.removeprefix("serve-") not in self.charts
            and n not in SCEN_PARTS[1:]
        ]
        conflicts = [*inputs, self.parts["serve-run"], self.parts["scen-run"]]
        self.serving = Runner(
            self,
            "The serving run",
            controls=conflicts,
            stop=self.parts["serve-stop"],
            stopping="Stopping the serving run…",
        )
        self.scenarios = Runner(
            self,
            "The scenario",
            controls=conflicts,
            stop=self.parts["scen-stop"],
            stopping="Stopping the scenario…",
        )
        wire(self)

    # --- the Tab protocol ---

    def figures(self):
        return [*self.charts.values(), self.parts["scen-chart"]]

    def export_figures(self):
        return {"scenario (broken vs fixed)": self.parts["scen-chart"]} if self.scenario else {}

    # --- running ---

    def workload(self):
        """The Workload, engine and its Knobs from the widgets (ValueError, readable)."""
        from explorer.serving import Workload

        def value(name: str):
            return self.parts[f"serve-{name}"].value

        arrival = ARRIVALS[value("arrival")]
        wl = Workload(
            num_prompts=value("requests"),
            arrival=arrival,
            request_rate=value("rate") if arrival != "burst" else None,
            burstiness=value("burstiness"),
            max_concurrency=value("concurrency") or None,
            input_len=value("input"),
            output_len=value("output"),
        )
        if wl.num_prompts > 256:
            raise ValueError(f"at most 256 requests in the dashboard, got {wl.num_prompts}")
        return wl, value("engine"), read_knobs(self.parts, value("engine"))

    def start(self) -> bool:
        """Serve the workload on a background thread; False (a message) if it did not start."""
        from explorer.serving import parse_goodput

        try:
            wl, engine, knobs = self.workload()
            slos = parse_goodput(self.parts["serve-slos"].value.strip() or None)
        except ValueError as err:
            self.dash.guard.fail(err, "The serving run")
            return False
        lm = self.dash.session.lm
        return self.serving.start(
            f"Serving {wl.num_prompts} requests through {engine} on {lm.info.name}… "
            "(Stop keeps the requests that finished)",
            self._run,
            lm,
            wl,
            engine,
            knobs,
            slos,
        )

    def stop(self) -> None:
        """Stop whichever of the tab's runs is on (what finished is kept)."""
        for r in self.runners:
            if r.active:
                r.stop()

    def _run(self, lm, wl, engine, knobs, slos) -> None:
        from explorer.serving import serve

        t0 = time.perf_counter()
        self._count += 1
        res = serve(
            lm,
            wl,
            engine,
            goodput=slos,
            stop=self.serving.stop_event,
            label=f"{engine} #{self._count}",
            knobs=knobs,
        )
        self.show(res)
        r = res.result
        status = res.meta["status"]
        said = status == "complete" or self.serving.stop_event.is_set()  # Stop marks it itself
        self.serving.finished(
            f"{res.label}: {r['completed']} of {len(res.records)} requests served, "
            f"{r['output_throughput']:.0f} output tok/s, p99 TTFT {ms_value(r['p99_ttft_ms'])}; "
            f"{time.perf_counter() - t0:.1f} s in all with the engine's start-up (the "
            f"summary's duration, {r['duration']:.2f} s, runs from the first arrival to the "
            "last finish)" + ("" if said else f" ({status})"),
            notes=status != "complete",
        )

    def start_scenario(self) -> bool:
        """Run the picked scenario (broken, then fixed) on a background thread."""
        name = self.parts["scen-name"].value
        lm = self.dash.session.lm
        return self.scenarios.start(
            f"Running the {name} scenario on {lm.info.name}… (Stop keeps what finished)",
            self._run_scenario,
            lm,
            name,
            doing=f"The {name} scenario",
        )

    def _run_scenario(self, lm, name: str) -> None:
        from explorer.serving import scenarios

        g = self.dash.guard
        t0 = time.perf_counter()

        def progress(*what) -> None:
            g.say(f"{name}: {' '.join(str(w) for w in what)}… (Stop keeps what finished)", "busy")

        res = scenarios.run(name, lm, stop=self.scenarios.stop_event, progress=progress)
        self.show_scenario(res)
        self.scenarios.finished(
            f"{name}: {res.verdict}; {time.perf_counter() - t0:.1f} s in all", partial=res.partial
        )

    def show_scenario(self, res) -> None:
        """Draw a ScenarioResult: broken beside fixed on one chart; verdict, why, evidence."""
        self.scenario = res
        plots.redraw(self.parts["scen-chart"], plots.scenario_figure(res))
        refit(self.parts["scen-chart"])
        self.parts["scen-verdict"].value = scenario_html(res)

    def show(self, res) -> None:
        """Draw a run's views (the CDFs beside the last runs') and its summary."""
        from explorer.serving import format_summary

        self.results = [*self.results, res][-KEEP:]
        plots.redraw(self.charts["gantt"], plots.gantt_figure(res))
        plots.redraw(self.charts["itl"], plots.itl_figure(res))
        plots.redraw(self.charts["cdf"], plots.cdf_figure(self.results))
        if res.iterations:
            plots.redraw(self.charts["state"], plots.engine_figure(res))
        else:
            plots.redraw(
                self.charts["state"],
                plots.placeholder_figure(
                    "Inside the engine", f"{res.engine.get('engine')} records no engine iterations"
                ),
            )
        for chart in self.charts.values():
            refit(chart)
        m = res.meta
        where = f"measured on {m.get('model')} ({m.get('device')}, {m.get('dtype')}), one run"
        link = download_link(
            _json(res),
            f"serving-{res.label.replace(' ', '').replace('#', '-')}.json",
            "result (JSON, vLLM's keys)",
        )
        self.parts["serve-summary"].value = (
            f"<pre style='font-size:11px;line-height:1.25'>{html.escape(format_summary(res))}</pre>"
            f"{where} · {link}"
        )


SCEN_ROWS = (  # (label, result key, format) of the broken-vs-fixed table
    ("requests completed", "completed", "{:.0f}"),
    ("output tok/s", "output_throughput", "{:.1f}"),
    ("p99 TTFT (ms)", "p99_ttft_ms", "{:.0f}"),
    ("p99 ITL (ms)", "p99_itl_ms", "{:.1f}"),
    ("preemptions", "preemptions", "{:.0f}"),
    ("steady", "steady", "{}"),
)


def scenario_html(res) -> str:
    """The verdict (bold), the why, a broken-vs-fixed table and the evidence, as HTML."""
    kind = "modelled (simulator)" if res.modelled else "measured on the loaded model, one run each"
    head = f"<b>{html.escape(res.verdict)}</b>"
    if res.partial:
        head += " <span style='color:#b26b00'>(partial: stopped; what finished is kept)</span>"
    runs = [("broken", res.broken), ("fixed", res.fixed)]
    cells = "".join(
        f"<tr><td>{label}</td>"
        + "".join(f"<td>{_cell(r, key, fmt)}</td>" for _, r in runs)
        + "</tr>"
        for label, key, fmt in SCEN_ROWS
    )
    table = (
        "<table style='font-size:12px'><tr><th></th>"
        + "".join(f"<th>{role}: {html.escape(r.label) if r else '-'}</th>" for role, r in runs)
        + f"</tr>{cells}</table>"
    )
    evidence = ", ".join(
        f"{html.escape(str(k))} = {_fmt(v)}"
        for k, v in res.evidence.items()
        if not isinstance(v, (dict, list))  # the runs' headlines are the table above
    )
    return (
        f"{head}<br>{html.escape(res.why)}<br>{table}<small>evidence: {evidence}<br>{kind}</small>"
    )


def _cell(res, key: str, fmt: str) -> str:
    if res is None:
        return "-"
    if key == "preemptions" and key not in res.result:
        value = sum(i.preempted for i in res.iterations) if res.iterations else None
    else:
        value = res.result.get(key)
    return html.escape(text(value, fmt))


def _fmt(v) -> str:
    return html.escape(f"{v:.3g}" if isinstance(v, float) else str(v))


def _json(res) -> str:
    import json

    return json.dumps(res.to_dict(), default=str)
