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
    if args.html:
        from explorer import plots

        figs = [
            plots.token_strip(trace),
            plots.latency(trace),
            plots.traffic(trace),
            plots.roofline(trace),
        ]
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
        print(
            f"{s.index:>4}  {s.phase:<7} {repr(s.token_text)[:16]:<16} p={s.prob_final:.3f}  "
            f"{s.latency_s * 1e3:8.2f} ms"
        )
    print(f"text: {trace.text!r}")
    if args.html:
        print(f"charts written to {args.html}")
    return 0
