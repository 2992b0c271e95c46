"""Plotly's widget code, fetched by the browser once per page instead of once per figure.

    figure_widget_class()   go.FigureWidget, or in a kernel of `explorer app` one that loads the bundle by URL
    plotly_bundle()         the file the server's static route serves (plotly's widgetbundle.js)

The Voila server process loads this file by its path (see server.py): it imports nothing from explorer.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

WIDGET_JS_ROUTE = (
    "explorer/static/"  # under the server's base URL; serves plotly's widgetbundle.js only
)
WIDGET_JS_ENV = "EXPLORER_WIDGET_JS"  # set for the kernels: the bundle's path under the base URL
LOADER_JS = Path(__file__).with_name("figure_loader.js")  # the FigureWidget `_esm` of an app kernel


def plotly_bundle() -> Path:
    """plotly's FigureWidget front-end code (an ES module of ~5 MB that includes plotly.js)."""
    import plotly.basewidget

    return Path(str(plotly.basewidget.__file__)).parent / "package_data" / "widgetbundle.js"


def figure_widget_class():
    """go.FigureWidget, or (in a kernel of `explorer app`) a subclass that ships a 3 kB loader instead.

    A stock FigureWidget sends plotly's 5 MB widget bundle inline with every figure (an anywidget
    `_esm`): 9 figures = 45 MB over the websocket and 9 module parses before the page is usable.
    The loader (figure_loader.js) imports the bundle by URL from this server, so the browser fetches
    and parses it once, and it is ready at once so anywidget's 2 s limit on a model's start cannot
    freeze a chart when the bundle is slow to arrive (it replays the updates that came meanwhile).
    """
    import plotly.graph_objects as go

    path = os.environ.get(WIDGET_JS_ENV)
    if not path:
        return go.FigureWidget
    global _LINKED
    if _LINKED is None or _LINKED._explorer_path != path:
        esm = LOADER_JS.read_text().replace("BUNDLE_URL", json.dumps(path))
        _LINKED = type(
            "FigureWidget",
            (go.FigureWidget,),
            {"_esm": esm, "_explorer_path": path, "__module__": __name__},
        )
    return _LINKED


_LINKED = None
