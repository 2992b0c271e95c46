"""Responsiveness of the dashboard in a real browser (a report, not a test): `explorer app` + Debian chromium.

    python scripts/bench_browser.py [--clicks 20] [--long-model arch:smollm2-135m] [--long-steps 1000] [--json FILE]

Measures, with the bundled target unless said otherwise:
  * time to interactive: navigation -> Step button enabled, with a preheated kernel (median of --loads pages)
  * Step click -> DOM change of the token strip text and of the distribution chart, on the page's own
    clock (MutationObserver from the click), median and p95 over --clicks clicks at about step 10
  * Play: tokens per second shown in the strip over --play-s seconds; how many steps Pause lets through
  * Step at a long run vs at step 10: the bundled target stops at its 512 positions, so the long run is
    also done with --long-model (an architecture-only shape with a long context: random weights)
Everything runs on this machine's CPU alongside whatever else runs here: the load average is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

from explorer.app.voila import browser as bs  # noqa: E402


def pct(values: list[float], q: float) -> float:
    xs = sorted(values)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def summary(values: list[float]) -> dict:
    return (
        {
            "n": len(values),
            "median": statistics.median(values),
            "p95": pct(values, 0.95),
            "min": min(values),
            "max": max(values),
        }
        if values
        else {"n": 0}
    )


def steps_taken(page) -> int:
    m = re.match(r"step (\d+)", bs.step_count(page))
    return int(m.group(1)) if m else -1


def settle(page) -> None:
    bs.wait_quiet(page)
    page.wait_for_selector(bs.STEP_READY, timeout=60000)


def timed_clicks(page, n: int) -> dict:
    """n Step clicks, each timed click -> strip text and distribution changed; waits for the redraw between."""
    strip, dist, both, picture, missed = [], [], [], [], 0
    for _ in range(n):
        r = bs.click_and_time(page, "step")
        settle(page)
        if r["both_ms"] is None:
            missed += 1
            continue
        if r.get("picture_ms") is not None:
            picture.append(r["picture_ms"])
        strip.append(r["strip_ms"])
        dist.append(r["dist_ms"])
        both.append(r["both_ms"])
    return {
        "strip_ms": summary(strip),
        "dist_ms": summary(dist),
        "both_ms": summary(both),
        **({"picture_ms": summary(picture)} if picture else {}),
        "missed": missed,
        "at_step": steps_taken(page),
    }


def step_n(page, n: int) -> None:
    for _ in range(n):
        target = steps_taken(page) + 1
        page.click(bs.STEP_READY)
        page.wait_for_function(
            "(n) => { const m = /step (\\d+)/.exec(document.querySelector('.ie-step-count')"
            ".innerText); return m && Number(m[1]) >= n; }",
            arg=target,
            timeout=60000,
        )
        settle(page)


def play_rate(page, seconds: float) -> dict:
    """Click Play, count the tokens the strip shows over `seconds`, click Pause; how many steps the
    engine took after the Pause click (from Play's closing message: "... after N tokens ...")."""
    start_tokens, t0 = bs.token_count(page), time.perf_counter()
    page.click("button.ie-play")
    page.wait_for_function(
        "(n) => document.querySelectorAll('.ie-strip-text .ie-tok').length > n",
        arg=start_tokens,
        timeout=60000,
    )
    first_tokens, t1 = bs.token_count(page), time.perf_counter()
    time.sleep(seconds)
    end_tokens, t2 = bs.token_count(page), time.perf_counter()
    shown_at_pause = steps_taken(page)
    page.evaluate(
        "() => { const b = document.querySelector('button.ie-pause'); if (!b.disabled) b.click(); }"
    )
    page.wait_for_function(
        "() => /Play (paused|stopped)/.test(document.querySelector('.ie-message').innerText)",
        timeout=60000,
    )
    message = bs.message_text(page)
    m = re.search(r"after (\d+) tokens", message)
    bs.wait_quiet(page)
    return {
        "tokens_per_s": (end_tokens - first_tokens) / (t2 - t1),
        "tokens": end_tokens - first_tokens,
        "seconds": t2 - t1,
        "click_to_first_token_s": t1 - t0,
        "message": message,
        "stopped_by_itself": "Play stopped" in message,
        "engine_steps_after_shown_pause": (start_tokens + int(m.group(1)) - shown_at_pause)
        if m
        else None,
    }


def new_session(page, model: str | None, max_tokens: int) -> None:
    """Pick the model and max tokens (each change starts a new session); wait until it is ready."""
    if model is not None:
        page.select_option(".ie-model select", model)
        page.wait_for_function(
            "(m) => document.querySelector('.ie-message').innerText.includes(m)",
            arg=model,
            timeout=180000,
        )
    bs.set_value(page, "max-tokens", str(max_tokens))
    page.wait_for_function(
        "() => /step 0\\b/.test(document.querySelector('.ie-step-count').innerText)", timeout=60000
    )
    settle(page)


def play_until(page, steps: int, timeout_s: float) -> int:
    page.click("button.ie-play")
    page.wait_for_selector("button.ie-pause:not([disabled])", timeout=60000)  # Play has started
    page.wait_for_function(
        "(n) => { const m = /step (\\d+)/.exec(document.querySelector('.ie-step-count')"
        ".innerText); return m && Number(m[1]) >= n || document.querySelector('button.ie-pause')"
        ".disabled; }",
        arg=steps,
        timeout=timeout_s * 1000,
    )
    if page.is_enabled("button.ie-pause"):
        page.click("button.ie-pause")
    settle(page)
    return steps_taken(page)


def long_run(page, model: str | None, steps: int, clicks: int) -> dict:
    new_session(page, model, steps + clicks + 50)
    step_n(page, 10)
    early = timed_clicks(page, clicks)
    reached = play_until(page, steps, timeout_s=1800)
    late = timed_clicks(page, clicks)
    ratio = (
        late["both_ms"]["median"] / early["both_ms"]["median"] if early["both_ms"]["n"] else None
    )
    return {
        "model": model or "bundled:target",
        "early": early,
        "late": late,
        "reached": reached,
        "late_over_early": ratio,
        "message": bs.message_text(page),
    }


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    reason = bs.browser_unavailable()
    if reason:
        print(f"bench_browser: {reason}", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    out: dict = {"load_average_start": os.getloadavg(), "cpus": os.cpu_count()}
    server = bs.AppServer(pool_size=1, cull_idle_timeout=30)
    t0 = time.perf_counter()
    server.start()
    out["server_ready_s"] = time.perf_counter() - t0
    try:
        with sync_playwright() as pw:
            browser = bs.launch_chromium(pw)
            ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
            bs.answer_offline(ctx, server.url)
            tti, page = _time_to_interactive(server, ctx, args.loads)
            out["time_to_interactive_s"] = summary(tti)
            server.wait_pool()  # the refill kernel has started up: it no longer competes for the CPU
            # Run past <|endoftext|>, so Play and the long runs measure steps, not stops.
            page.uncheck(bs.STOP_EOS)
            page.wait_for_function(bs.EOS_OFF_JS, timeout=60000)
            new_session(page, None, 0)  # 0 = no token limit but the model's positions (512)
            step_n(page, 10)
            if args.tab:  # e.g. "The step, drawn": its picture redraws on every Step (picture_ms)
                bs.open_tab(page, args.tab)
                settle(page)
            out["step_at_10"] = timed_clicks(page, args.clicks)
            print(
                f"Step -> strip & distribution at step ~10: {out['step_at_10']['both_ms']}",
                flush=True,
            )
            out["play"] = play_rate(page, args.play_s)
            print(f"Play: {out['play']}", flush=True)
            out["long_target"] = long_run(page, None, args.target_steps, args.clicks)
            print(
                f"bundled target, step {out['long_target']['reached']} vs 10: "
                f"x{out['long_target']['late_over_early']:.2f}",
                flush=True,
            )
            if not args.skip_long_model:
                out["long_model"] = long_run(page, args.long_model, args.long_steps, args.clicks)
                print(
                    f"{args.long_model}, step {out['long_model']['reached']} vs 10: "
                    f"x{out['long_model']['late_over_early']:.2f}",
                    flush=True,
                )
            browser.close()
    finally:
        server.stop()
    out["load_average_end"] = os.getloadavg()
    text = json.dumps(out, indent=2, default=float)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--tab",
        default=None,
        help="open this tab before the timed clicks (e.g. 'The step, drawn': its picture is timed too)",
    )
    ap.add_argument("--clicks", type=int, default=20)
    ap.add_argument("--loads", type=int, default=3, help="pages opened for the time to interactive")
    ap.add_argument("--play-s", type=float, default=5.0)
    ap.add_argument(
        "--target-steps",
        type=int,
        default=300,
        help="long run with the bundled target (its 512 positions must hold prompt, Play's overshoot and the clicks)",
    )
    ap.add_argument("--long-model", default="arch:smollm2-135m")
    ap.add_argument("--long-steps", type=int, default=1000)
    ap.add_argument("--skip-long-model", action="store_true")
    ap.add_argument("--json", default=None, help="also write the results here")
    return ap


def _time_to_interactive(server, ctx, loads: int):
    """Open the dashboard `loads` times (a preheated kernel ready and quiet before each); returns
    the seconds to interactive of each and the last page, left open."""
    tti, page = [], None
    for _ in range(loads):
        server.wait_pool()  # a preheated kernel is ready and quiet before each navigation
        if page is not None:
            page.close()
        page, seconds = bs.open_dashboard(ctx, server.url)
        tti.append(seconds)
        print(f"time to interactive: {seconds:.2f} s", flush=True)
    return tti, page


if __name__ == "__main__":
    sys.exit(main())
