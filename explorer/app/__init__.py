"""The dashboard: ipywidgets + plotly views over an explorer.Session (see explorer.app.dashboard)."""

from explorer.app.dashboard import Dashboard

__all__ = ["Dashboard"]
