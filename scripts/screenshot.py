"""The README's picture of the dashboard: `explorer app` + Debian chromium, a fresh page, a few steps.

    python scripts/screenshot.py [--out assets/dashboard.png] [--steps 16] [--temperature 0.7] [--seed 1]
    python scripts/screenshot.py --out assets/why.png --tab "Why this time?" --click why-profile-run

Serves the app on a free local port with temporary HOME/Jupyter folders, opens it at 1400x1000, sets
the sampling, clicks Step --steps times, then (with --tab) opens that tab and (with --click) presses those buttons, and saves a full-page PNG. Nothing in the test suite writes it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import browser_support as bs  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO / "assets" / "dashboard.png")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--temperature", default="0.7")
    p.add_argument("--seed", default="1")
    p.add_argument("--tab", help="the title of a tab to open before the picture")
    p.add_argument("--click", action="append", default=[], help="a button's part name (repeatable)")
    a = p.parse_args(argv)
    if reason := bs.browser_unavailable():
        sys.exit(reason)
    from playwright.sync_api import sync_playwright

    with bs.AppServer(pool_size=1) as app, sync_playwright() as pw:
        browser = bs.launch_chromium(pw)
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        bs.answer_offline(context, app.url)
        page, tti = bs.open_dashboard(context, app.url, timeout_s=120)
        page.uncheck(".ie-stop-eos input")  # a document may end within 16 tokens: show what follows
        bs.wait_quiet(page)
        bs.set_value(page, "temperature", a.temperature)
        bs.wait_quiet(page)
        bs.set_value(page, "seed", a.seed)
        bs.wait_quiet(page)
        page.click("button.ie-reset")
        page.wait_for_selector(bs.STEP_READY, timeout=60000)
        for _ in range(a.steps):
            bs.click_and_time(page, "step", timeout_ms=30000)
            page.wait_for_selector(bs.STEP_READY, timeout=30000)
        bs.wait_quiet(page, settle_ms=500)
        if a.tab:
            page.locator(".lm-TabBar-tab", has_text=a.tab).first.click()
            bs.wait_quiet(page, settle_ms=500)
        for part in a.click:
            page.click(f"button.ie-{part}")
            bs.wait_quiet(page, settle_ms=1500)
        page.screenshot(path=str(a.out), full_page=True)
        browser.close()
    print(
        f"{a.out} ({a.out.stat().st_size:,} bytes); page interactive in {tti:.1f} s; {a.steps} steps"
    )


if __name__ == "__main__":
    main()
