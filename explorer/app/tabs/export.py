"""The Export tab: the trace as JSON / CSV, or any chart as a standalone HTML file, as a download link."""

from __future__ import annotations

import time

import ipywidgets as W

from explorer import plots
from explorer.app.controls import tagged
from explorer.app.export import download_link, trace_csv, trace_json
from explorer.app.tabs import Tab, register

TRACE_CHOICES = ["trace JSON", "trace CSV"]
PNG_CHARTS = ("step drawn", "operators roofline")  # also offered as PNG (chromium draws them)


def build(choices: list[str]) -> tuple[W.Widget, dict]:
    """The tab's widget and its parts (name -> widget, CSS class ie-<name>); no callbacks."""
    what = W.Dropdown(
        options=choices, value="trace JSON", description="export", layout=W.Layout(width="300px")
    )
    button = W.Button(
        description="Prepare download", icon="download", layout=W.Layout(width="auto")
    )
    parts = {
        "export-what": tagged(what, "export-what"),
        "export-button": tagged(button, "export-button"),
        "export-links": tagged(W.HTML(value=""), "export-links"),
    }
    widget = W.VBox([W.HBox([what, button]), parts["export-links"]])
    parts["export"] = tagged(widget, "export")
    return widget, parts


@register(90)
class ExportTab(Tab):
    name, title = "export", "Export"
    about = (
        "Save what you see: the session's trace (every step, as JSON to replay or CSV for a "
        "spreadsheet) or one chart as an HTML file that opens offline. Pick, press Prepare "
        "download, then click the link."
    )

    def __init__(self, dash):
        super().__init__(dash)
        self.widget, self.parts = build(self._choices())
        self.what, self.links = self.parts["export-what"], self.parts["export-links"]
        self.parts["export-button"].on_click(
            dash.guard.action("Export", lambda _: self.prepare(), while_busy=True)
        )

    def _choices(self) -> list[str]:
        names = list(self.dash.export_figures())
        return (TRACE_CHOICES + [f"chart: {name}" for name in names]
                + [f"chart PNG: {name}" for name in names if name in PNG_CHARTS])  # fmt: skip

    def set_live(self, live: bool) -> None:
        """Shown: offer every chart the dashboard's tabs export (a tab added later included)."""
        choices = self._choices()
        if live and list(self.what.options) != choices:
            value = self.what.value
            self.what.options = choices
            self.what.value = value if value in choices else TRACE_CHOICES[0]

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
            page = plots.figure_html(dash.export_figures(current=True)[name])
            if what.startswith("chart PNG: "):
                from explorer.app.voila.browser import png_of_html

                link = download_link(png_of_html(page), f"{name.replace(' ', '-')}-{stamp}.png")
            else:
                link = download_link(page, f"{name.replace(' ', '-')}-{stamp}.html")
        self.links.value = link
        dash.guard.say(f"Ready: click the link under Export to save the {what}.", "ok")
        return link
