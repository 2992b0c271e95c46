"""The README's pictures of the dashboard: `explorer app` + Debian chromium, a fresh page, a few steps.

    python scripts/screenshot.py                  # assets/dashboard.png and one assets/tab-<name>.png per tab
    python scripts/screenshot.py --only dashboard # just the whole page after --steps steps
    python scripts/screenshot.py --out-dir /tmp/shots --steps 16 --temperature 0.7 --seed 1

Serves the app on a free local port with temporary HOME/Jupyter folders, opens it at 1400x1000, sets
the sampling, clicks Step --steps times and saves the whole page; then opens every tab in turn
(explorer.app.voila.browser.TAB_TOUR), presses its main control, waits for the run to finish and saves the tab.
Whatever a person would see wrong is printed (a figure's axis range not covering its data, a log
axis beyond 10^12, a placeholder left in a drawn chart, a console error, a tab without its
explanation line) and makes the exit status 1. Nothing in the test suite writes these files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from explorer.app.voila import browser as bs  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def prepare(page, a) -> None:
    """Sampling as asked, stop at end-of-text off (a document may end within 16 tokens), steps."""
    page.uncheck(".ie-stop-eos input")
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


def shoot_whole(page, element, path: Path) -> None:
    """A picture of `element` at its full height (the window grown to hold it, then put back)."""
    size = page.viewport_size
    box = element.bounding_box()
    page.set_viewport_size({"width": size["width"], "height": int(box["y"] + box["height"]) + 40})
    bs.wait_quiet(page, settle_ms=500)
    element.screenshot(path=str(path))
    page.set_viewport_size(size)


def tour(page, out_dir: Path, only: str | None, errors: list[str]) -> list[str]:
    """Every tab: open it, press its controls, save it; returns the problems seen (a console
    error is put down to the tab open when it came)."""
    problems = [f"before the tour: console: {e}" for e in errors]
    for title, name, parts in bs.TAB_TOUR:
        errors.clear()
        if only and only != name:
            continue
        bs.open_tab(page, title)
        for part in parts:
            bs.press_and_wait(page, part)
        if not bs.shown_about(page):
            problems.append(f"{title}: no explanation line")
        problems += [f"{title}: {p}" for p in bs.figure_problems(page)]
        problems += [f"{title}: console: {e}" for e in errors]
        path = out_dir / f"tab-{name}.png"
        shoot_whole(page, page.locator(".ie-tabs"), path)
        print(f"{path} ({path.stat().st_size:,} bytes)", flush=True)
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", type=Path, default=REPO / "assets")
    p.add_argument("--only", help="'dashboard', or one tab's picture name (latency, capacity, ...)")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--temperature", default="0.7")
    p.add_argument("--seed", default="1")
    a = p.parse_args(argv)
    if reason := bs.browser_unavailable():
        sys.exit(reason)
    from playwright.sync_api import sync_playwright

    a.out_dir.mkdir(parents=True, exist_ok=True)
    with bs.AppServer(pool_size=1) as app, sync_playwright() as pw:
        browser = bs.launch_chromium(pw)
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        bs.answer_offline(context, app.url)
        page, tti = bs.open_dashboard(context, app.url, timeout_s=120)
        errors = bs.collect_console_errors(page)
        prepare(page, a)
        if a.only in (None, "dashboard"):
            page.screenshot(path=str(a.out_dir / "dashboard.png"), full_page=True)
        if a.only == "dashboard":
            problems = [f"console: {e}" for e in errors]
        else:
            problems = tour(page, a.out_dir, a.only, errors)
        browser.close()
    print(f"page interactive in {tti:.1f} s; {a.steps} steps")
    for line in problems:
        print("PROBLEM", line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
