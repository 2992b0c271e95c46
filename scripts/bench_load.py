"""Load benchmark (a report, not a test): N concurrent browser sessions against one `explorer app`.

    python scripts/bench_load.py [--sessions 4,8] [--steps 20] [--pool-size 1] [--cull-idle-timeout 10]
                                 [--stagger S] [--json FILE]

Each count in --sessions (default 4 and 8 visitors) is one run of its own server, one after the
other. Each kernel's torch threads come from the cores and the pool size
(explorer.app.voila.sharing.THREADS_RULE), as `explorer app` sets them.

Each session is its own browser context (own cookies, own kernel) in one Debian chromium; all of them
open the dashboard at once and then click Step `--steps` times, each click timed on the page's clock
from the click to the change of the token strip and the distribution chart. Reported:
  * per-session step latency, median and p95, and time to interactive
  * failures: a click without a DOM change in 60 s, an error in the message area, a page that never
    became interactive (must be 0)
  * peak memory of the server and all its kernels, sampled every second: sum of PSS (shared pages split
    between processes: what the machine really holds) and sum of RSS (counts shared libraries each time)
  * kernels alive after every tab has closed: must come back to the pool size (idle culling)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

from explorer.app.voila import browser as bs  # noqa: E402

MB = 1024 * 1024


T_START = time.perf_counter()


def progress(text: str) -> None:
    """One line on stderr as the run goes (a long run on a small machine should not look hung)."""
    print(f"[{time.perf_counter() - T_START:7.1f} s] {text}", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float | None:
    xs = sorted(values)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))] if xs else None


class MemorySampler(threading.Thread):
    """Samples tree_memory() of the server every `every` seconds; keeps the peaks and the kernel count."""

    def __init__(self, server: bs.AppServer, every: float = 1.0):
        super().__init__(daemon=True)
        self.server, self.every = server, every
        self.peak = {"rss": 0, "pss": 0, "uss": 0, "processes": 0}
        self.samples = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            m = self.server.memory()
            for k in self.peak:
                self.peak[k] = max(self.peak[k], m.get(k, 0))
            self.samples += 1
            if self.samples % 15 == 0:
                progress(
                    f"server + {m.get('processes', 1) - 1} child processes: {m.get('pss', 0) / MB:.0f} MB PSS, "
                    f"load average {os.getloadavg()[0]:.1f}"
                )
            self._halt.wait(self.every)

    def stop(self) -> dict:
        self._halt.set()
        self.join()
        return self.peak


async def session(
    browser, url: str, steps: int, index: int, delay_s: float = 0.0, shots: str | None = None
) -> dict:
    out = {"session": index, "latencies_ms": [], "failures": [], "tti_s": None}
    await asyncio.sleep(delay_s)
    ctx, page = await _open_page(browser, url, out)

    async def fail(text: str, shot: str) -> None:
        """Record a failure; say it, with the page's last console errors; screenshot the page (--shots)."""
        out["failures"].append(text)
        progress(f"session {index}: {shot}: {text}")
        for line in out["console_errors"][-5:]:
            progress(f"session {index}: console: {line}")
        if shots:
            await page.screenshot(path=str(Path(shots) / f"session{index}-{shot}.png"))

    try:
        t0 = time.perf_counter()
        await page.goto(url, wait_until="commit", timeout=300_000)
        await page.wait_for_selector(bs.STEP_READY, timeout=300_000)
        out["tti_s"] = time.perf_counter() - t0
        progress(f"session {index}: interactive after {out['tti_s']:.1f} s")
        await page.uncheck(bs.STOP_EOS)  # run past <|endoftext|>: 20 steps, not a stop
        await page.wait_for_function(bs.EOS_OFF_JS, timeout=120_000)
        await page.wait_for_selector(bs.STEP_READY, timeout=120_000)
        for i in range(steps):
            r = bs.timed_result(await page.evaluate(bs.TIMED_CLICK_JS, ["step", 60_000]))
            if r["both_ms"] is None:
                seen = await page.evaluate("""() => { const d = document.querySelector('.ie-dist');
                    return d ? {svg: d.querySelectorAll('svg').length, bars: d.querySelectorAll('.bars path').length,
                                html: d.innerHTML.length} : null; }""")
                await fail(
                    f"no strip/distribution change within 60 s: {r}; distribution view: {seen}",
                    f"step{i + 1}",
                )
            else:
                out["latencies_ms"].append(r["both_ms"])
            await page.evaluate(bs.WAIT_QUIET_JS, [150, 30_000])
            await page.wait_for_selector(bs.STEP_READY, timeout=60_000)
            message = (await page.inner_text(".ie-message")).lower()
            if "error" in message or "failed" in message:
                await fail(f"message: {message[:200]}", f"step{i + 1}-message")
            if (i + 1) % 5 == 0:
                lat = out["latencies_ms"]
                progress(
                    f"session {index}: {i + 1}/{steps} steps, median so far "
                    f"{statistics.median(lat) if lat else float('nan'):.0f} ms"
                )
    except Exception as err:  # a page that broke is a failure, reported with the others
        await fail(f"{type(err).__name__}: {str(err)[:300]}", "failed")
    out["page"], out["context"] = page, ctx
    return out


async def _open_page(browser, url: str, out: dict):
    """A new browser context and page that loads only the app's own assets (anything else gets an
    empty stylesheet) and records the page's console errors in out["console_errors"]."""
    ctx = await browser.new_context(viewport={"width": 1400, "height": 1000})

    async def route(r):
        if r.request.url.startswith(url.rstrip("/")) or r.request.url.startswith(
            ("data:", "blob:")
        ):
            await r.continue_()
        else:
            await r.fulfill(status=200, body="", content_type="text/css")

    await ctx.route("**/*", route)
    page = await ctx.new_page()
    out["console_errors"] = []
    page.on("console", lambda m: m.type == "error" and out["console_errors"].append(m.text[:300]))
    page.on("pageerror", lambda e: out["console_errors"].append(f"page error: {str(e)[:300]}"))
    return ctx, page


async def run_sessions(
    url: str, sessions: int, steps: int, stagger_s: float = 0.0, shots: str | None = None
) -> list[dict]:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=bs.chromium_path(), args=bs.CHROMIUM_ARGS
        )
        results = await asyncio.gather(
            *(session(browser, url, steps, i, i * stagger_s, shots) for i in range(sessions))
        )
        for r in results:  # close every tab the way a person does (beforeunload runs)
            await r.pop("page").close(run_before_unload=True)
            await r.pop("context").close()
        await browser.close()
    return results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sessions", default="4,8", help="visitor counts, one run each (e.g. 4,8)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--pool-size", type=int, default=1)
    ap.add_argument("--cull-idle-timeout", type=int, default=10)
    ap.add_argument(
        "--stagger",
        type=float,
        default=0.0,
        help="seconds between one session opening the page and the next (default 0: all at once)",
    )
    ap.add_argument("--shots", default=None, help="folder for a screenshot of each failed step")
    ap.add_argument("--json", default=None)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        counts = [int(v) for v in str(args.sessions).split(",") if v.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        print(
            f"bench_load: --sessions takes whole numbers >= 1, e.g. 4,8; got {args.sessions!r}",
            file=sys.stderr,
        )
        return 2
    reason = bs.browser_unavailable()
    if reason:
        print(f"bench_load: {reason}", file=sys.stderr)
        return 2
    runs, ok = {}, True
    for n in counts:
        args.sessions = n
        print(f"--- {n} visitors")
        runs[n], good = run_once(args)
        ok = ok and good
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=2, default=str))
    return 0 if ok else 1


def run_once(args: argparse.Namespace) -> tuple[dict, bool]:
    """One server, args.sessions visitors: the report, and whether it passed its checks."""
    from explorer.app.voila.config import AppConfig

    out: dict = {
        "sessions": args.sessions,
        "threads_per_kernel": AppConfig(pool_size=args.pool_size).threads,
        "steps": args.steps,
        "pool_size": args.pool_size,
        "cull_idle_timeout_s": args.cull_idle_timeout,
        "stagger_s": args.stagger,
        "cpus": os.cpu_count(),
        "load_average_start": os.getloadavg(),
    }
    results = measure(args, out)
    out["load_average_end"] = os.getloadavg()
    summarise(results, out)
    print_report(out, args)
    return out, out["failures"] == 0 and out["kernels_alive_after_close"] == args.pool_size


def measure(args: argparse.Namespace, out: dict) -> list[dict]:
    """Start the app, run every session, close the tabs and wait for the pool to come back; the
    wall time, kernel counts and memory go into `out`. Returns each session's results."""
    server = bs.AppServer(pool_size=args.pool_size, cull_idle_timeout=args.cull_idle_timeout)
    server.start()
    progress(f"explorer app up at {server.url} with {len(server.kernels())} preheated kernel(s)")
    out["idle_memory_mb"] = {k: v / MB for k, v in server.memory().items() if k != "processes"}
    sampler = MemorySampler(server)
    sampler.start()
    try:
        t0 = time.perf_counter()
        results = asyncio.run(
            run_sessions(server.url, args.sessions, args.steps, args.stagger, args.shots)
        )
        out["wall_s"] = time.perf_counter() - t0
        out["kernels_when_tabs_closed"] = len(server.kernels())
        progress(
            f"all tabs closed; {out['kernels_when_tabs_closed']} kernels alive; waiting for culling"
        )
        t1 = time.perf_counter()
        # culling, then the pool's own refill
        deadline = args.cull_idle_timeout + 60 + 30 * args.pool_size
        alive = server.wait_kernels(args.pool_size, timeout_s=deadline)
        out["kernels_alive_after_close"] = alive
        out["kernels_back_to_pool_s"] = (
            time.perf_counter() - t1 if alive == args.pool_size else None
        )
        peak = sampler.stop()
    finally:
        if sampler.is_alive():
            sampler.stop()
        server.stop()
    out["peak_memory_mb"] = {k: (v / MB if k != "processes" else v) for k, v in peak.items()}
    return results


def summarise(results: list[dict], out: dict) -> None:
    """Per-session and overall step latencies (median, p95) and the failure count, into `out`."""
    per = []
    for r in results:
        lat = r["latencies_ms"]
        per.append(
            {
                "session": r["session"],
                "tti_s": r["tti_s"],
                "steps_ok": len(lat),
                "median_ms": statistics.median(lat) if lat else None,
                "p25_ms": pct(lat, 0.25),
                "p95_ms": pct(lat, 0.95),
                "failures": r["failures"],
                "console_errors": r["console_errors"],
            }
        )
    everything = [x for r in results for x in r["latencies_ms"]]
    out["per_session"] = per
    out["all_steps"] = {
        "n": len(everything),
        "median_ms": statistics.median(everything) if everything else None,
        "p95_ms": pct(everything, 0.95),
    }
    out["failures"] = sum(len(r["failures"]) for r in results)


def print_report(out: dict, args: argparse.Namespace) -> None:
    for p in out["per_session"]:
        med = f"{p['median_ms']:.0f}" if p["median_ms"] is not None else "-"
        p95 = f"{p['p95_ms']:.0f}" if p["p95_ms"] is not None else "-"
        tti = f"{p['tti_s']:.1f}" if p["tti_s"] is not None else "-"
        p25 = f"{p['p25_ms']:.0f}" if p["p25_ms"] is not None else "-"
        print(
            f"visitor {p['session']}: interactive after {tti} s, {p['steps_ok']}/{args.steps} steps, "
            f"Step latency p25 {p25} ms, median {med} ms, p95 {p95} ms, failures {len(p['failures'])}"
        )
    print(
        f"all steps: median {out['all_steps']['median_ms']} ms, p95 {out['all_steps']['p95_ms']} ms"
    )
    pk = out["peak_memory_mb"]
    print(
        f"peak memory, server + kernels: {pk['pss']:.0f} MB PSS ({pk['rss']:.0f} MB RSS, {pk['processes']} processes)"
    )
    print(f"failures: {out['failures']}")
    print(
        f"{out['sessions']} visitors on {out['cpus']} cores, {out['threads_per_kernel']} torch "
        f"threads per kernel; load average {out['load_average_start'][0]:.1f} at the start, "
        f"{out['load_average_end'][0]:.1f} at the end (other work on the machine slows every step)"
    )
    print(
        f"kernels: {out['kernels_when_tabs_closed']} when the tabs closed, {out['kernels_alive_after_close']} "
        f"after culling (pool size {args.pool_size})"
    )


if __name__ == "__main__":
    sys.exit(main())
