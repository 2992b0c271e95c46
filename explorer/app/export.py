"""Export from the dashboard: the Trace as JSON / CSV, any chart as standalone HTML, as download links.

ipywidgets has no file-download widget, and in Voila the visitor cannot reach the kernel's files,
so a download is an HTML widget holding an `<a download>` link with a data: URI (base64). A chart
page inlines plotly.js (~4.7 MB) so it opens offline.
"""

from __future__ import annotations

import base64
import html

from explorer.engine.trace import Trace

MIME = {"json": "application/json", "csv": "text/csv", "html": "text/html", "png": "image/png"}


def trace_json(trace: Trace) -> str:
    return trace.to_json(indent=1)


def trace_csv(trace: Trace) -> str:
    return trace.to_frame().to_csv(index=False)


def download_link(content: str | bytes, filename: str, label: str | None = None) -> str:
    """HTML of a link that saves `content` (text, or bytes such as a PNG) as `filename` when
    clicked (a data: URI, base64)."""
    ext = filename.rsplit(".", 1)[-1]
    raw = content if isinstance(content, bytes) else content.encode("utf-8")
    data = base64.b64encode(raw).decode("ascii")
    size = len(raw)
    text = html.escape(label or filename)
    return (
        f'<a class="ie-download" download="{html.escape(filename, quote=True)}" '
        f'href="data:{MIME.get(ext, "application/octet-stream")};base64,{data}" '
        f'style="margin-right:1em">⬇ {text}</a> <span style="color:#777">({_size(size)})</span>'
    )


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} KB"
