"""The Serving tab: a small workload through one engine on the dashboard's model (explorer.serving).

Engine, arrivals, rate, concurrency, lengths and SLOs are widgets; Run serves the workload on a
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
from explorer.app.controls import labelled, stop_button, tagged
from explorer.app.export import download_link
from explorer.app.tabs import Tab, register
from explorer.app.views import figure_widget, refit

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


@register(45)
class ServingTab(Tab):
    name, title = "serving", "Serving"

    def __init__(self, dash):
        super().__init__(dash)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.results: list = []  # the last KEEP ServingResults, newest last
        self._count = 0

        box = labelled(self.parts, "serve", "100px")

        self.engine = box(
            W.Dropdown,
            "engine",
            "continuous",
            "engine",
            "260px",
            options=["sequential", "static", "continuous"],
        )
        self.arrival = box(
            W.Dropdown, "arrival", "all at once", "arrivals", "260px", options=list(ARRIVALS)
        )
        self.rate = box(W.FloatText, "rate", 8.0, "rate (req/s)")
        self.burstiness = box(W.FloatText, "burstiness", 1.0, "burstiness")
        self.concurrency = box(W.IntText, "concurrency", 0, "max in flight")
        self.requests = box(W.IntText, "requests", 16, "requests")
        self.input_len = box(W.IntText, "input", 32, "prompt tokens")
        self.output_len = box(W.IntText, "output", 16, "output tokens")
        self.max_batch = box(W.IntText, "max-batch", 8, "static: batch")
        self.kv_blocks = box(W.IntText, "kv-blocks", 256, "KV blocks")
        self.page_size = box(W.IntText, "page-size", 32, "block tokens")
        self.slos = box(W.Text, "slos", "ttft:500 tpot:50", "SLOs (ms)", "260px")
        self.run_button = tagged(
            W.Button(
                description="Run",
                icon="play",
                button_style="primary",
                tooltip="serve the workload on the loaded model",
            ),
            "serve-run",
        )
        self.stop_button = stop_button(
            "serve-stop", "stop the run (finished requests are kept)", self.stop
        )
        self.run_button.on_click(lambda _: self.start())
        self.summary = tagged(W.HTML(value=""), "serve-summary")
        self.charts = {}
        for key, title in VIEWS:
            chart = figure_widget(plots.placeholder_figure, title)
            chart.add_class(f"ie-serve-{key}")
            self.charts[key] = chart
            self.parts[f"serve-{key}"] = chart
        self.parts.update(
            {
                "serve-run": self.run_button,
                "serve-stop": self.stop_button,
                "serve-summary": self.summary,
            }
        )
        self.inputs = [
            w
            for n, w in self.parts.items()
            if n not in ("serve-run", "serve-stop", "serve-summary")
            and n.removeprefix("serve-") not in self.charts
        ]
        rows = [
            W.HBox([self.engine, self.arrival, self.rate, self.burstiness]),
            W.HBox([self.requests, self.input_len, self.output_len, self.concurrency]),
            W.HBox([self.max_batch, self.kv_blocks, self.page_size, self.slos]),
        ]
        self.widget = W.VBox(
            [
                W.HTML(
                    "Many requests on one machine, measured on the loaded model: static "
                    "batches wait for their longest request; continuous batching "
                    "(transformers' own engine) lets requests join and leave every "
                    "iteration. TTFT, TPOT, ITL and goodput follow vLLM's definitions."
                ),
                *rows,
                W.HBox([self.run_button, self.stop_button]),
                self.summary,
                *self.charts.values(),
            ]
        )
        self.widget.add_class("ie-serving")
        self.parts["serving"] = self.widget

    # --- the Tab protocol ---

    def figures(self):
        return list(self.charts.values())

    def threads(self):
        return [self._thread]

    def set_busy(self, busy: bool) -> None:
        for w in [*self.inputs, self.run_button]:
            w.disabled = busy
        self.stop_button.disabled = not busy or self._thread is None

    # --- running ---

    def workload(self):
        """The Workload and engine knobs from the widgets (ValueError with a readable message)."""
        from explorer.serving import Workload

        arrival = ARRIVALS[self.arrival.value]
        wl = Workload(
            num_prompts=self.requests.value,
            arrival=arrival,
            request_rate=self.rate.value if arrival != "burst" else None,
            burstiness=self.burstiness.value,
            max_concurrency=self.concurrency.value or None,
            input_len=self.input_len.value,
            output_len=self.output_len.value,
        )
        if wl.num_prompts > 256:
            raise ValueError(f"at most 256 requests in the dashboard, got {wl.num_prompts}")
        engine = self.engine.value
        knobs = {}
        if engine == "static":
            knobs = {"max_batch": self.max_batch.value}
        elif engine == "continuous":
            knobs = {"num_blocks": self.kv_blocks.value, "page_size": self.page_size.value}
        return wl, engine, knobs

    def start(self) -> bool:
        from explorer.serving import parse_goodput

        g = self.dash.guard
        try:
            wl, engine, knobs = self.workload()
            slos = parse_goodput(self.slos.value.strip() or None)
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
                **knobs,
            )
            self.show(res)
            r = res.result
            status = res.meta["status"]
            g.say(
                f"{res.label}: {r['completed']} of {len(res.records)} requests in "
                f"{time.perf_counter() - t0:.1f} s, {r['output_throughput']:.0f} output tok/s, "
                f"p99 TTFT {_ms(r['p99_ttft_ms'])}"
                + ("" if status == "complete" else f" ({status})"),
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
        self.summary.value = (
            f"<pre style='font-size:11px;line-height:1.25'>{html.escape(format_summary(res))}</pre>"
            f"{where} · {link}"
        )


def _ms(v) -> str:
    return "n/a" if v is None else f"{v:.0f} ms"


def _json(res) -> str:
    import json

    return json.dumps(res.to_dict(), default=str)
