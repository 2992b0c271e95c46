"""The Export tab: the trace as JSON / CSV, or any chart as a standalone HTML file, as a download link."""

from __future__ import annotations

import time

import ipywidgets as W

from explorer import plots
from explorer.app.export import download_link, trace_csv, trace_json
from explorer.app.tabs import Tab, register

CHARTS = ("token strip", "distribution", "latency", "traffic", "roofline")


@register(90)
class ExportTab(Tab):
    name, title = "export", "Export"

    def __init__(self, dash):
        super().__init__(dash)
        self.what = W.Dropdown(
            options=["trace JSON", "trace CSV", *(f"chart: {c}" for c in CHARTS)],
            value="trace JSON",
            description="export",
            layout=W.Layout(width="260px"),
        )
        self.button = W.Button(description="Prepare download", icon="download")
        self.button.add_class("ie-export-button")
        self.links = W.HTML(value="")
        self.links.add_class("ie-export-links")
        self.widget = W.VBox([W.HBox([self.what, self.button]), self.links])
        self.widget.add_class("ie-export")
        self.button.on_click(dash.guard.action("Export", lambda _: self.prepare(), while_busy=True))
        self.parts = {
            "export": self.widget,
            "export-button": self.button,
            "export-links": self.links,
            "export-what": self.what,
        }

    def prepare(self) -> str:
        """Build the download link for the dropdown's choice; returns its HTML."""
        what, dash = self.what.value, self.dash
        trace = dash.session.trace
        stamp = time.strftime("%Y%m%d-%H%M%S")
        if what == "trace JSON":
            link = download_link(trace_json(trace), f"trace-{stamp}.json")
        elif what == "trace CSV":
            link = download_link(trace_csv(trace), f"trace-{stamp}.csv")
        else:
            name = what.split(": ", 1)[1]
            for tab in dash.tab_list:
                tab.flush()
            fig = {
                "token strip": dash.strip.fig,
                "distribution": dash.dist.figure(),
                "latency": dash.latency.fig,
                "traffic": dash.traffic.fig,
                "roofline": dash.roofline.fig,
            }[name]
            link = download_link(plots.figure_html(fig), f"{name.replace(' ', '-')}-{stamp}.html")
        self.links.value = link
        dash.guard.say(f"Ready: click the link under Export to save the {what}.", "ok")
        return link
