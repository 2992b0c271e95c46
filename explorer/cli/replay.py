"""explorer replay FILE: a saved trace (Trace.save / the dashboard's export) shown with no model loaded."""

from __future__ import annotations

from explorer.cli.common import print_json

ORDER = 35


def add(sub) -> None:
    p = sub.add_parser(
        "replay", help="show a saved trace file (no model needed); --html writes its charts"
    )
    p.add_argument(
        "trace",
        metavar="FILE",
        help="a trace JSON file (Trace.save(), explorer generate --json, Export)",
    )
    p.add_argument(
        "--html",
        default=None,
        metavar="OUT",
        help="write the strip, latency, traffic and roofline charts to one HTML file",
    )
    p.add_argument(
        "--why",
        action="store_true",
        help="each step's speed-of-light split (floors, overhead, MBU, regime) from the saved costs",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from explorer.engine.trace import Trace

    trace = Trace.load(args.trace)  # TraceFormatError / OSError: one line from main()
    steps = trace.steps
    decode = [s.latency_s for s in steps if s.phase == "decode"]
    summary = {
        "file": args.trace,
        "model": trace.model.get("name"),
        "device": trace.device,
        "dtype": trace.dtype,
        "steps": len(steps),
        "stop_reason": trace.stop_reason,
        "text": trace.text,
        "prefill_ms": steps[0].latency_s * 1e3 if steps else None,
        "decode_ms_median": sorted(decode)[len(decode) // 2] * 1e3 if decode else None,
    }
    if args.why:
        summary["why"] = _why(trace)
    if args.html:
        from explorer import plots

        figs = [
            plots.token_strip(trace),
            plots.latency(trace),
            plots.traffic(trace),
            plots.roofline(trace),
        ]
        last = next((s for s in reversed(steps) if s.phase == "decode" and s.bound_s), None)
        if last is not None:
            figs.append(plots.split_figure(last))
        with open(args.html, "w") as f:
            f.write("".join(plots.figure_html(fig) for fig in figs))
        summary["html"] = args.html
    if args.json:
        print_json(summary)
        return 0
    print(
        f"{args.trace}: {summary['model']} on {trace.device} ({trace.dtype}), {len(steps)} steps, "
        f"stop: {trace.stop_reason} (latencies measured when it was recorded)"
    )
    for s in steps:
        why = (
            f"  bound {s.bound_s * 1e3:7.3f} ms  overhead {s.overhead_s * 1e3:7.3f} ms  "
            f"MBU {s.mbu:.2f}  MFU {s.mfu:.3f}  {s.regime}"
            if args.why and s.overhead_s is not None
            else ""
        )
        print(
            f"{s.index:>4}  {s.phase:<7} {repr(s.token_text)[:16]:<16} p={s.prob_final:.3f}  "
            f"{s.latency_s * 1e3:8.2f} ms{why}"
        )
    if args.why:
        w = summary["why"]
        print(f"regimes: {w['regimes']} ({w['rule']})")
        print(f"note: {w['needs_model']}")
    print(f"text: {trace.text!r}")
    if args.html:
        print(f"charts written to {args.html}")
    return 0


def _why(trace) -> dict:
    """The split of every step (computed from the saved costs and peaks where the file lacks it) and
    what needs the model itself."""
    from collections import Counter

    from explorer.costs.split import FALLBACK_RULE, REGIME_RULE, split_trace

    if trace.hardware and any(s.regime is None for s in trace.steps):
        split_trace(trace)  # an older file: the split from its own flops, bytes and peaks
    floor = (trace.overhead_floor or {}).get("floor_s")
    name = trace.model.get("name") or "the model"
    return {
        "regimes": dict(Counter(s.regime for s in trace.steps if s.regime)),
        "rule": REGIME_RULE if floor is not None else FALLBACK_RULE,
        "overhead_floor_s": floor,
        "needs_model": (
            "the profiler breakdown, the logit lens and the attention view replay a step on the "
            f"model itself: a saved trace has none; load {name} and use Session.profile_step(), "
            "logit_lens() and attention() (or the dashboard's Why this time? and Inside tabs)"
        ),
    }
