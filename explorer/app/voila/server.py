"""The Voila server process that `explorer app` starts: `python server.py NOTEBOOK --voila-options...`.

Voila with the culling kernel manager (kernel_pool.py) and one static route, plotly's widget bundle
(assets.py). Those two files are loaded by their paths, never through the explorer package: the
server process imports no torch and no dashboard (only its kernels do).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def load_sibling(name: str):
    """The module `name`.py of this folder, loaded by its path."""
    spec = importlib.util.spec_from_file_location(f"explorer_voila_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def voila_app_class(assets):
    """Voila plus one static route: plotly's widget bundle (see assets.figure_widget_class)."""
    from jupyter_server.utils import url_path_join
    from tornado.web import StaticFileHandler
    from voila.app import Voila

    class ExplorerVoila(Voila):
        def init_handlers(self) -> list:
            route = url_path_join(self.server_url, assets.WIDGET_JS_ROUTE, r"(widgetbundle\.js)")
            return [
                (route, StaticFileHandler, {"path": str(assets.plotly_bundle().parent)}),
                *super().init_handlers(),
            ]

    return ExplorerVoila


if __name__ == "__main__":
    sys.path.pop(0)  # not this folder: its modules must not shadow anything
    # named by serve.voila_command(): __main__.ExplorerKernelManager
    ExplorerKernelManager = load_sibling("kernel_pool").kernel_manager_class()
    voila_app_class(load_sibling("assets")).launch_instance(argv=sys.argv[1:])
