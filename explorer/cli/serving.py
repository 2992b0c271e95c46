"""explorer bench serving: a workload through one engine, with vllm bench serve's summary table.

Registered under `explorer bench` (cli/bench.py lists it); the flags follow `vllm bench serve`.
"""

from __future__ import annotations

import json
import math
import sys

from explorer.cli.common import whole, writable


def add_bench_serving(bench) -> None:
    from explorer.serving import ENGINES

    p = bench.add_parser(
        "serving", help="many requests through one engine: TTFT, TPOT, ITL, throughput, goodput"
    )
    p.add_argument("--engine", choices=ENGINES, default="continuous")
    p.add_argument(
        "--model",
        default=None,
        help="local model (default bundled:target); with --engine http its tokenizer makes "
        "the text prompts",
    )
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="http engine: the server")
    p.add_argument("--served-model", default=None, help="http engine: the model name it serves")
    p.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    p.add_argument(
        "--request-timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="http engine: seconds a request may wait for the server's next bytes",
    )
    add_workload_flags(p)
    p.add_argument(
        "--goodput",
        nargs="+",
        default=None,
        metavar="SLO",
        help="SLOs in ms, e.g. --goodput ttft:500 tpot:50",
    )
    p.add_argument("--max-batch", type=int, default=8, help="static engine: requests per batch")
    p.add_argument(
        "--max-wait-ms",
        type=float,
        default=50.0,
        help="static engine: how long a batch waits to fill",
    )
    p.add_argument("--num-blocks", type=int, default=None, help="continuous: KV blocks (budget)")
    p.add_argument("--page-size", type=int, default=None, help="continuous: tokens per KV block")
    p.add_argument(
        "--max-batch-tokens",
        type=int,
        default=None,
        help="continuous: query tokens per iteration (prefill chunk limit)",
    )
    p.add_argument("--max-requests-per-batch", type=int, default=None)
    p.add_argument("--scheduler", choices=("fifo", "prefill_first"), default="fifo")
    p.add_argument(
        "--compare",
        default=None,
        metavar="ENGINES",
        help="also run these engines (comma-separated) and print throughput ratios",
    )
    p.add_argument(
        "--vs-plain",
        action="store_true",
        help="continuous: alternate with plain generate_batch (no recording) and print "
        "the throughput ratio",
    )
    p.add_argument("--repeats", type=whole(1), default=3, help="--vs-plain: alternating repeats")
    p.add_argument("--json", default=None, metavar="FILE", help="write the result (vLLM's keys)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.set_defaults(func=run)


def add_workload_flags(p) -> None:
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument(
        "--request-rate",
        type=float,
        default=None,
        help="requests/s (default: all at once, vLLM's inf)",
    )
    p.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="gamma arrivals' shape (1: Poisson); with --request-rate",
    )
    p.add_argument(
        "--arrival",
        choices=("poisson", "gamma", "fixed"),
        default=None,
        help="with --request-rate (default poisson; gamma when --burstiness != 1)",
    )
    p.add_argument(
        "--max-concurrency", type=int, default=None, help="closed loop: at most C in flight"
    )
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument(
        "--workload",
        default=None,
        metavar="FILE",
        help="a workload .json or a trace .jsonl ({prompt, max_tokens, arrival_s} lines)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-ignore-eos", action="store_true", help="stop at EOS (lengths then vary)")


def workload_of(args):
    from explorer.serving import Workload

    if args.workload:
        return Workload.load(args.workload)
    arrival = "burst"
    if args.request_rate is not None:
        arrival = args.arrival or ("gamma" if args.burstiness != 1.0 else "poisson")
    return Workload(
        num_prompts=args.num_prompts,
        arrival=arrival,
        request_rate=args.request_rate,
        burstiness=args.burstiness,
        max_concurrency=args.max_concurrency,
        input_len=args.input_len,
        output_len=args.output_len,
        seed=args.seed,
        ignore_eos=not args.no_ignore_eos,
    )


def knobs_of(args, engine: str) -> dict:
    if engine == "static":
        return {"max_batch": args.max_batch, "max_wait_s": args.max_wait_ms / 1e3}
    if engine == "continuous":
        names = ("num_blocks", "page_size", "max_batch_tokens", "max_requests_per_batch")
        out = {k: getattr(args, k) for k in names if getattr(args, k) is not None}
        return {**out, "scheduler": args.scheduler}
    if engine == "http":
        timeout = getattr(args, "request_timeout", 600.0)
        if not math.isfinite(timeout) or timeout <= 0:
            raise ValueError(f"--request-timeout must be a number of seconds > 0, got {timeout}")
        return {
            "base_url": args.base_url,
            "served_model": args.served_model,
            "endpoint": args.endpoint,
            "timeout_s": timeout,
        }
    return {}


def run(args) -> int:
    from explorer.model.loader import load
    from explorer.serving import ENGINES, parse_goodput, serve
    from explorer.serving.run import RunInterrupted

    goodput = parse_goodput(args.goodput)
    workload = workload_of(args)  # a bad setting fails before anything loads
    writable(args.json, "--json")
    for name in [args.engine] + _compared(args):
        if name not in ENGINES:
            raise ValueError(
                f"--compare: unknown engine {name!r}; the engines are {', '.join(ENGINES)}"
            )
        knobs_of(args, name)  # a bad flag fails before anything loads
    # http: the local model's tokenizer only cuts the prompts as text (the server tokenizes them
    # again and reports its own counts), as vllm bench serve uses --tokenizer
    lm = load(args.model, device=args.device, dtype=args.dtype)
    try:
        res = serve(lm, workload, args.engine, goodput=goodput, **knobs_of(args, args.engine))
    except RunInterrupted as stopped:  # keep what it measured, marked partial; go no further
        _report(args, stopped.result)
        raise
    _report(args, res)
    if args.compare:
        _compare(args, lm, workload, goodput, res)
    if args.vs_plain:
        _vs_plain(args, lm, workload)
    return _exit_status(res)


def _report(args, res) -> None:
    from explorer.serving import format_summary

    print(format_summary(res))
    if res.meta.get("partial"):
        print(f"status: {res.meta['status']} (partial: these figures are not a finished run)")
    if args.json:
        res.save(args.json)
        print(
            f"result written to {args.json}" + (" (marked partial)" if res.meta["partial"] else "")
        )


def _exit_status(res) -> int:
    """Non-zero, with one line on stderr, when not one request completed."""
    if any(r.ok for r in res.records):
        return 0
    errors = sorted({r.error for r in res.records if r.error})
    print(
        f"explorer: every one of the {len(res.records)} requests failed ({'; '.join(errors[:3])})",
        file=sys.stderr,
    )
    return 1


def _compared(args) -> list[str]:
    return [e.strip() for e in (args.compare or "").split(",") if e.strip()]


def _compare(args, lm, workload, goodput, base) -> None:
    from explorer.serving import serve

    print(f"\nthe same workload ({workload.num_prompts} requests) on other engines:")
    for name in _compared(args):
        other = serve(lm, workload, name, goodput=goodput, **knobs_of(args, name))
        ratio = base.result["output_throughput"] / max(other.result["output_throughput"], 1e-9)
        print(
            f"  {name:<11} {other.result['output_throughput']:9.1f} output tok/s, median TTFT "
            f"{other.result['median_ttft_ms']:.1f} ms; {args.engine}/{name} throughput = {ratio:.2f}x"
        )


def _vs_plain(args, lm, workload) -> None:
    import statistics
    import time

    from explorer.serving import serve
    from explorer.serving.engines.continuous import plain_throughput

    if args.engine != "continuous":
        raise ValueError("--vs-plain compares the continuous engine with plain generate_batch")
    knobs = knobs_of(args, "continuous")
    reqs = workload.requests(lm)
    ours, bare, plain = [], [], []

    def wall(record: bool) -> float:
        t0 = time.perf_counter()  # wall time of the whole call, manager set-up included, as plain
        res = serve(lm, workload, "continuous", record=record, **knobs)
        return res.result["total_output_tokens"] / (time.perf_counter() - t0)

    for _ in range(args.repeats):  # alternating, after the run above warmed everything
        plain.append(plain_throughput(lm, reqs, **knobs)["output_throughput"])
        ours.append(wall(True))
        bare.append(wall(False))
    a, b, c = (statistics.median(x) for x in (ours, plain, bare))
    print(
        f"\nrecording cost, {args.repeats} alternating repeats (medians of output tokens / wall "
        f"time of the whole call, manager set-up included):\n"
        f"  serve() recording every iteration   {a:9.1f} tok/s\n"
        f"  serve() with recording off          {c:9.1f} tok/s   ratio recorded/off = {a / c:.3f}\n"
        f"  plain model.generate_batch()        {b:9.1f} tok/s   ratio recorded/plain = {a / b:.3f}"
    )
    print(
        json.dumps(
            {
                "recorded_tok_s": ours,
                "unrecorded_tok_s": bare,
                "plain_tok_s": plain,
                "ratio_vs_unrecorded": a / c,
                "ratio_vs_plain": a / b,
            }
        )
    )
