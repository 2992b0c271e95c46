"""The Sweeps tab (provisional until explorer.experiments lands)."""

from __future__ import annotations

import threading

import ipywidgets as W


class SweepsTab:
    def __init__(self, dash):
        self.dash = dash
        self._thread: threading.Thread | None = None
        self.widget = W.VBox([W.HTML("explorer.experiments is not available yet.")])
        self.widget.add_class("ie-sweeps")
        self.parts: dict = {}

    def figures(self):
        return []

    def threads(self):
        return [self._thread]

    def set_busy(self, busy: bool) -> None:
        pass
