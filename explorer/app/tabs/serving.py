"""The Serving tab: a small workload through one engine on the dashboard's model (explorer.serving).

Engine, arrivals, rate, concurrency, lengths and SLOs are widgets, and each engine knob's control
is built from the engine's Knobs declaration (shown while that engine is chosen); Run serves the workload on a
background thread (the kernel stays responsive; Stop keeps the requests that finished) and draws
the request Gantt, the ITL timeline with prefill iterations shaded, the latency CDFs of the last
runs side by side, and the engine's own batch and KV-cache state. Any error is a message; the
settings and the last run's views stay as they were.
"""

from __future__ import annotations

import html
import threading
import time

import ipywidgets as W

from explorer import plots
from explorer.app.controls import control, labelled, read_control, tagged
from explorer.app.export import download_link
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
        ]
    )
    widget.add_class("ie-serving")
    parts["serving"] = widget
    return widget, parts


def wire(tab: ServingTab) -> None:
    """Run and Stop call the tab; the engine's choice shows its knobs."""
    parts = tab.parts
    parts["serve-run"].on_click(lambda _: tab.start())
    parts["serve-stop"].on_click(lambda _: tab.stop())
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
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.results: list = []  # the last KEEP ServingResults, newest last
        self._count = 0
        self.widget, self.parts = build()
        self.charts = {key: self.parts[f"serve-{key}"] for key, _ in VIEWS}
        self.inputs = [
            w
            for n, w in self.parts.items()
            if n not in BUTTONS and n.removeprefix("serve-") not in self.charts
        ]
        wire(self)

    # --- the Tab protocol ---

    def figures(self):
        return list(self.charts.values())

    def threads(self):
        return [self._thread]

    def set_busy(self, busy: bool) -> None:
        for w in [*self.inputs, self.parts["serve-run"]]:
            w.disabled = busy
        self.parts["serve-stop"].disabled = not busy or self._thread is None

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
        from explorer.serving import parse_goodput

        g = self.dash.guard
        try:
            wl, engine, knobs = self.workload()
            slos = parse_goodput(self.parts["serve-slos"].value.strip() or None)
        except ValueError as err:
            g.fail(err, "The serving run")
            return False
        if not g.start("The serving run"):
            return False
        self._stop.clear()
        lm = self.dash.session.lm
        g.say(
            f"Serving {wl.num_prompts} requests through {engine} on {lm.info.name}… "
            "(Stop keeps the requests that finished)",
            "busy",
        )
        self._thread = threading.Thread(
            target=self._run,
            args=(lm, wl, engine, knobs, slos),
            name="explorer-serving",
            daemon=True,
        )
        self.set_busy(True)  # before start(): a run that fails at once re-enables the controls
        self._thread.start()
        return True

    def stop(self) -> None:
        self._stop.set()
        self.dash.guard.say("Stopping the serving run…", "busy")

    def _run(self, lm, wl, engine, knobs, slos) -> None:
        from explorer.serving import serve

        g = self.dash.guard
        t0 = time.perf_counter()
        try:
            self._count += 1
            res = serve(
                lm,
                wl,
                engine,
                goodput=slos,
                stop=self._stop,
                label=f"{engine} #{self._count}",
                knobs=knobs,
            )
            self.show(res)
            r = res.result
            status = res.meta["status"]
            g.say(
                f"{res.label}: {r['completed']} of {len(res.records)} requests served, "
                f"{r['output_throughput']:.0f} output tok/s, p99 TTFT {_ms(r['p99_ttft_ms'])}; "
                f"{time.perf_counter() - t0:.1f} s in all with the engine's start-up (the "
                f"summary's duration, {r['duration']:.2f} s, runs from the first arrival to the "
                "last finish)" + ("" if status == "complete" else f" ({status})"),
                "ok" if status == "complete" else "info",
            )
        except Exception as err:  # noqa: BLE001 - shown; the views keep the previous run
            g.fail(err, "The serving run")
        finally:
            g.finish()

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


def _ms(v) -> str:
    return "n/a" if v is None else f"{v:.0f} ms"


def _json(res) -> str:
    import json

    return json.dumps(res.to_dict(), default=str)
