"""Plotly's widget code, fetched by the browser once per page instead of once per figure.

    figure_widget_class()   a FigureWidget whose front-end code loads plotly's bundle once per page:
                            by URL in a kernel of `explorer app`, else from plotly_bundle_widget()
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
    """A FigureWidget subclass that ships a 3 kB loader instead of plotly's 5 MB bundle.

    A stock FigureWidget sends plotly's 5 MB widget bundle inline with every figure (an anywidget
    `_esm`): the dashboard's 34 figures were 172 MB over the websocket and 34 module parses, about
    a minute and a half before a dashboard in a JupyterLab cell could be used. The loader
    (figure_loader.js) gets the bundle once per page: in a kernel of `explorer app` by URL from
    this server; in any other kernel from the one PlotlyBundle widget (`plotly_bundle_widget()`,
    made with the first figure), which sends the bundle once and imports it in the browser. The
    loader is ready at once, so anywidget's 2 s limit on a model's start cannot freeze a chart
    when the bundle is slow to arrive (it replays the updates that came meanwhile).
    """
    import plotly.graph_objects as go

    path = os.environ.get(WIDGET_JS_ENV)
    key = path or "shared"
    if key not in _LINKED:
        if path:
            source = f"new URL({json.dumps(path)}, window.location.origin).href"
            module = "import(url)"
        else:
            source, module = '"the PlotlyBundle widget"', BUNDLE_PROMISE_JS
        esm = LOADER_JS.read_text()
        esm = esm.replace("BUNDLE_SOURCE", source).replace("PLOTLY_MODULE", module)
        _LINKED[key] = type(
            "FigureWidget",
            (go.FigureWidget,),
            {"_esm": esm, "_explorer_path": path, "__module__": __name__},
        )
    if not path:
        plotly_bundle_widget()
    return _LINKED[key]


_LINKED: dict = {}
# The page's one promise of plotly's module, made by whichever comes first: a figure's loader or
# the PlotlyBundle widget that resolves it.
BUNDLE_PROMISE_JS = (
    "(globalThis.__explorerPlotly ??= (() => { let done; const p = new Promise((r) => (done = r));"
    " p.resolve = done; return p; })())"
)
BUNDLE_WIDGET_ESM = f"""// plotly's widget bundle, sent once per kernel (assets.plotly_bundle_widget)
export default {{
  initialize({{ model }}) {{
    const promise = {BUNDLE_PROMISE_JS};
    if (promise.started) return;
    promise.started = true;
    const blob = new Blob([model.get("bundle")], {{ type: "text/javascript" }});
    import(URL.createObjectURL(blob)).then(promise.resolve, (err) => console.error(err));
  }},
}};
"""
_BUNDLE_WIDGET = None


def plotly_bundle_widget():
    """The kernel's one widget that sends plotly's bundle to the page (outside `explorer app`)."""
    global _BUNDLE_WIDGET
    if _BUNDLE_WIDGET is None:
        import anywidget
        import traitlets

        class PlotlyBundle(anywidget.AnyWidget):
            _esm = traitlets.Unicode(BUNDLE_WIDGET_ESM).tag(sync=True)
            bundle = traitlets.Unicode().tag(sync=True)

        _BUNDLE_WIDGET = PlotlyBundle(bundle=plotly_bundle().read_text())
    return _BUNDLE_WIDGET
