"""Step latency per visitor when N visitors step at once on one classroom server, kernels only.

(scripts/bench_load.py measures the same through real browser sessions against `explorer app`,
click to redraw; this one needs no browser and says which steps other work interfered with.)

Each visitor is a separate process standing in for its Voila kernel: torch threads set as the
server sets them (explorer.app.voila.sharing.THREADS_RULE, with the pool size = N visitors), the
model loaded, then a Session stepped `--steps` times once every visitor is ready (a barrier), as N
people pressing Step together would. Per visitor: the Step latency (a low quantile and the median of
its decode steps, explorer.costs.noise) and how many of its steps were noisy (other work took more
than noise.BUSY_LIMIT of its CPU); then the same over all visitors.

    python scripts/bench_visitors.py                        # 4 and 8 visitors, bundled:target
    python scripts/bench_visitors.py --visitors 1,4 --steps 16 --model bundled:draft --json out.json

It measures the kernels, not the browser or the server's websocket (see tests/test_browser.py for
the page). On a machine others are using, every figure says how busy the machine was.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time


def _visitor(model: str, steps: int, threads: int, barrier, out, who: int) -> None:
    """One visitor's kernel: threads, model, a Session; `steps` Steps after the barrier."""
    import torch

    torch.set_num_threads(threads)
    from explorer import Sampling, Session, load

    lm = load(model)
    session = Session(lm, "The return statement", Sampling(greedy=True), stop_at_eos=False)
    barrier.wait()
    t0 = time.perf_counter()
    for _ in range(steps):
        session.step()
    wall = time.perf_counter() - t0
    decode = [s for s in session.steps if s.phase == "decode"]
    out.put(
        {
            "visitor": who,
            "threads": threads,
            "latency_s": [s.latency_s for s in decode],
            "cpu_share": [s.cpu_share for s in decode],
            "wall_s": wall,
        }
    )


def run_visitors(model: str, visitors: int, steps: int) -> list[dict]:
    """Every visitor's record (spawned processes, stepping together)."""
    from explorer.app.voila.sharing import kernel_threads

    threads = kernel_threads(os.cpu_count(), visitors)
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(visitors), ctx.Queue()
    procs = [
        ctx.Process(target=_visitor, args=(model, steps, threads, barrier, out, i))
        for i in range(visitors)
    ]
    for p in procs:
        p.start()
    got = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    return sorted(got, key=lambda r: r["visitor"])


def summary(records: list[dict]) -> dict:
    """Per visitor and over all: Step latency (estimate and median, ms) and noisy steps."""
    from explorer.costs import noise

    def figures(lat: list[float], shares: list) -> dict:
        q = noise.quantile_for(len(lat))
        noisy = sum(1 for s in shares if noise.busy_reason(s))
        return {
            "estimate_ms": 1e3 * noise.low_quantile(lat, q),
            "quantile": q,
            "median_ms": 1e3 * noise.median(lat),
            "steps": len(lat),
            "noisy_steps": noisy,
        }

    per = [{"visitor": r["visitor"], **figures(r["latency_s"], r["cpu_share"])} for r in records]
    every = [x for r in records for x in r["latency_s"]]
    shares = [x for r in records for x in r["cpu_share"]]
    return {"threads": records[0]["threads"], "per_visitor": per, "all": figures(every, shares)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--visitors", default="4,8", help="visitor counts to try, e.g. 4,8")
    p.add_argument("--steps", type=int, default=32, help="Steps each visitor presses")
    p.add_argument("--model", default="bundled:target")
    p.add_argument("--json", default=None, metavar="FILE")
    args = p.parse_args(argv)
    try:
        counts = [int(v) for v in args.visitors.split(",") if v.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or args.steps < 2:
        print(
            "bench_visitors: --visitors takes whole numbers >= 1 (4,8); --steps >= 2",
            file=sys.stderr,
        )
        return 2
    results = {}
    for n in counts:
        s = results[n] = summary(run_visitors(args.model, n, args.steps))
        a = s["all"]
        print(
            f"{n} visitors ({s['threads']} torch threads each, {os.cpu_count()} cores): Step "
            f"{a['estimate_ms']:.1f} ms ({'p25' if a['quantile'] else 'min'}), median "
            f"{a['median_ms']:.1f} ms over {a['steps']} decode steps; {a['noisy_steps']} noisy"
        )
        for v in s["per_visitor"]:
            print(
                f"  visitor {v['visitor']}: {v['estimate_ms']:.1f} ms, median "
                f"{v['median_ms']:.1f} ms, {v['noisy_steps']}/{v['steps']} steps noisy"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "steps": args.steps, "runs": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
