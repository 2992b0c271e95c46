"""The README's "Seeing it break" picture: a scenario run broken and fixed on the bundled model, its
chart (explorer.plots.scenario_figure) drawn by Debian chromium through playwright, saved as a PNG.

    python scripts/scenario_picture.py                          # assets/scenario-kv-exhaustion.png
    python scripts/scenario_picture.py kv-exhaustion --out /tmp/kv.png

Measured on this machine (one run each): the verdict in the chart's title is this run's own.
Nothing in the test suite writes this file.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from explorer import load, plots
from explorer.app.voila import browser as bs
from explorer.serving import scenarios

REPO = Path(__file__).resolve().parent.parent


def picture(fig, path: Path, width: int = 1100) -> None:
    """The figure as a PNG, drawn by chromium (plotly.js inlined: no network)."""
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        page_path = Path(tmp) / "figure.html"
        page_path.write_text(plots.figure_html(fig))
        with sync_playwright() as pw:
            browser = bs.launch_chromium(pw)
            page = browser.new_page(viewport={"width": width, "height": int(fig.layout.height)})
            page.goto(page_path.as_uri())
            page.wait_for_selector(".main-svg")
            page.locator(".plotly-graph-div").screenshot(path=str(path))
            browser.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", nargs="?", default="kv-exhaustion", choices=scenarios.names())
    ap.add_argument("--model", default="bundled:target")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    why = bs.browser_unavailable()
    if why:
        print(why)
        return 1
    res = scenarios.run(a.name, load(a.model), progress=print)
    out = a.out or REPO / "assets" / f"scenario-{a.name}.png"
    fig = plots.scenario_figure(res)
    fig.update_layout(width=1100)
    picture(fig, out)
    print(f"{out}: {res.verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
