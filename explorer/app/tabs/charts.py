"""The per-step chart tabs: Latency, Memory traffic, Roofline (each one LiveChart over the Steps)."""

from __future__ import annotations

from explorer import plots
from explorer.app.tabs import Tab, register
from explorer.app.views import LiveChart, figure_widget


def build(name: str, fig) -> tuple[object, dict]:
    """A chart tab's widget and its parts: the figure itself, under the tab's name."""
    return fig, {name: fig}


class ChartTab(Tab):
    """One live chart of the session's Steps; only the selected chart tab is sent data per step."""

    live_default = False

    def __init__(self, dash):
        super().__init__(dash)
        self.chart = self.build_chart(dash)
        self.widget, self.parts = build(self.name, self.chart.fig)

    def build_chart(self, dash) -> LiveChart:
        raise NotImplementedError

    def figures(self):
        return [self.chart.fig]

    def export_figures(self) -> dict:
        return {self.name: self.chart.fig}

    def set_live(self, live: bool) -> None:
        self.chart.set_live(live)

    def steps_added(self, steps) -> None:
        self.chart.append(steps)

    def steps_reset(self, steps) -> None:
        self.chart.reset(steps)

    def flush(self) -> None:
        self.chart.flush()


@register(10)
class LatencyTab(ChartTab):
    name, title = "latency", "Latency"
    about = (
        "How long each forward pass took (measured, one point per step): the first point is the "
        "prefill of the whole prompt, then one decode step per token. A rising line means each "
        "step reads more KV cache; the grey points are the run before a cache toggle."
    )

    def build_chart(self, dash) -> LiveChart:
        lm = dash.session.lm
        return LiveChart(
            figure_widget(plots.latency_figure, lm.info.device, lm.info.dtype),
            plots.latency_columns,
            "latency",
        )

    def steps_reset(self, steps) -> None:
        self.chart.reset(steps)
        earlier = self.dash.earlier
        name = plots.earlier_run_name(earlier[1]) if earlier else "earlier run"
        self.chart.fig.data[0].name = name
        plots.replace(
            self.chart.fig, plots.earlier_run_columns(earlier[0] if earlier else [], name)
        )

    def session_changed(self) -> None:
        lm = self.dash.session.lm
        self.chart.fig.update_layout(
            title=plots.latency_figure(lm.info.device, lm.info.dtype).layout.title
        )


@register(20)
class TrafficTab(ChartTab):
    name, title = "traffic", "Memory traffic"
    about = (
        "Left: the bytes each step moves, stacked by part (modelled: weights, KV cache read and "
        "written, activations). Right: those bytes over the step's measured time, the bandwidth "
        "achieved; the dashed line is this machine's measured peak. Decode is mostly weight bytes."
    )

    def build_chart(self, dash) -> LiveChart:
        return LiveChart(
            figure_widget(plots.traffic_figure), plots.traffic_columns, "traffic", live=False
        )

    def peaks_known(self, hardware: dict, chips: dict) -> None:
        label = ", ".join(
            str(hardware.get(k)) for k in ("device", "dtype", "method") if hardware.get(k)
        )
        plots.set_peak_bandwidth(self.chart.fig, hardware.get("bandwidth_gbps"), label)


@register(30)
class RooflineTab(ChartTab):
    name, title = "roofline", "Roofline"
    about = (
        "Each step as a point: FLOPs per byte moved (x, modelled) against FLOP/s achieved "
        "(modelled FLOPs / measured time). Under the sloped roof a step is memory-bound, under "
        "the flat one compute-bound; decode sits far left, prefill further right."
    )

    def build_chart(self, dash) -> LiveChart:
        return LiveChart(
            figure_widget(plots.roofline_figure), plots.roofline_columns, "roofline", live=False
        )

    def peaks_known(self, hardware: dict, chips: dict) -> None:
        plots.set_ceilings(self.chart.fig, hardware, chips)
