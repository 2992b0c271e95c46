"""The Voila server process that `explorer app` starts: `python server.py NOTEBOOK --voila-options...`.

Voila with the culling kernel manager (kernel_pool.py), plotly's widget bundle on a static route
(assets.py), our page template (templates/: Voila's lab template, whose wait for a kernel says what
is happening, for how long, and how long a start takes here) and that last figure on
explorer/starts.json. kernel_pool.py and assets.py are loaded by their paths, never through the
explorer package: the server process imports no torch and no dashboard (only its kernels do).
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


TEMPLATES = HERE / "templates"  # index.html.j2 (extends Voila's lab template) and its wait.js
STARTS_ROUTE = "explorer/starts.json"  # {"seconds": [...]}: the pool's last starts (kernel_pool.py)


def voila_app_class(assets):
    """Voila plus plotly's widget bundle (see assets.figure_widget_class), our page template and
    the pool's start times."""
    from jupyter_server.utils import url_path_join
    from tornado.web import RequestHandler, StaticFileHandler
    from voila.app import Voila

    class StartsHandler(RequestHandler):
        def initialize(self, app) -> None:
            self.app = app

        def get(self) -> None:
            seconds = list(getattr(self.app.kernel_manager, "start_seconds", ()))
            self.set_header("Cache-Control", "no-store")
            self.finish({"seconds": seconds})

    class ExplorerVoila(Voila):
        def setup_template_dirs(self) -> None:
            super().setup_template_dirs()
            self.template_paths = [str(TEMPLATES), *self.template_paths]  # our index.html.j2 first

        def init_handlers(self) -> list:
            route = url_path_join(self.server_url, assets.WIDGET_JS_ROUTE, r"(widgetbundle\.js)")
            return [
                (route, StaticFileHandler, {"path": str(assets.plotly_bundle().parent)}),
                (url_path_join(self.server_url, STARTS_ROUTE), StartsHandler, {"app": self}),
                *super().init_handlers(),
            ]

    return ExplorerVoila


if __name__ == "__main__":
    sys.path.pop(0)  # not this folder: its modules must not shadow anything
    # named by serve.voila_command(): __main__.ExplorerKernelManager
    ExplorerKernelManager = load_sibling("kernel_pool").kernel_manager_class()
    voila_app_class(load_sibling("assets")).launch_instance(argv=sys.argv[1:])
