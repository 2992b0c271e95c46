"""explorer bench serving: a workload through one engine, with vllm bench serve's summary table.

Registered under `explorer bench` (cli/bench.py lists it); the flags follow `vllm bench serve`.
Each engine knob's flag is built from the engine's Knobs declaration (explorer.serving.engines).
"""

from __future__ import annotations

import argparse
import json
import sys

from explorer.cli.common import whole, writable


def add_bench_serving(bench) -> None:
    from explorer.serving.engines import names

    p = bench.add_parser(
        "serving", help="many requests through one engine: TTFT, TPOT, ITL, throughput, goodput"
    )
    p.add_argument("--engine", choices=names(), default="continuous")
    p.add_argument(
        "--model",
        default=None,
        help="local model (default bundled:target); with --engine http its tokenizer makes "
        "the text prompts",
    )
    add_workload_flags(p)
    p.add_argument(
        "--goodput",
        nargs="+",
        default=None,
        metavar="SLO",
        help="SLOs in ms, e.g. --goodput ttft:500 tpot:50",
    )
    add_knob_flags(p, names())
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


def add_knob_flags(p, names: tuple[str, ...], table: dict | None = None) -> None:
    """One flag per knob of these engines, from the Knobs declarations (unset: the default;
    table: another knob table, such as the simulator policies' own)."""
    from explorer.serving.engines import knob_table

    for knob, (spec, default, takers) in (table or knob_table(names)).items():
        flag = spec.cli or "--" + knob.replace("_", "-")
        what = f"{', '.join(takers)} engine: {spec.help} (default {default})"
        if spec.kind is bool:
            p.add_argument(flag, dest=knob, action=argparse.BooleanOptionalAction, help=what)
        elif spec.choices:
            p.add_argument(flag, dest=knob, choices=spec.choices, help=what)
        else:
            meta = spec.kind.__name__.upper()
            what = f"{what}; {spec.range_text()}"
            p.add_argument(flag, dest=knob, type=spec.kind, metavar=meta, help=what)


def engine_knobs(args, engine: str):
    """The engine's validated Knobs: the flags given, the declaration's defaults for the rest."""
    from explorer.serving import engines

    return engines.knobs_of(engine, knobs_of(args, engine))[0]


def check_unused_knob_flags(args, running: tuple[str, ...], table: dict | None = None) -> None:
    """ValueError for a knob flag that no engine of this run takes (it would change nothing)."""
    from explorer.serving.engines import knob_table, names

    for knob, (spec, _, takers) in (table or knob_table(names())).items():
        if getattr(args, knob, None) is not None and not set(takers) & set(running):
            flag = spec.cli or "--" + knob.replace("_", "-")
            raise ValueError(
                f"{flag} is a knob of the {', '.join(takers)} engine, not of "
                f"{', '.join(running)}, the engine(s) of this run"
            )


def knobs_of(args, engine: str) -> dict:
    """The knobs of `engine` set by flags (the rest keep the declaration's defaults)."""
    from explorer.serving.simulate.policy import knobs_class

    names = knobs_class(engine).specs()  # a served engine's policy declares its own
    return {k: getattr(args, k) for k in names if getattr(args, k, None) is not None}


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


def run(args) -> int:
    from explorer.model.loader import load
    from explorer.serving import parse_goodput, serve
    from explorer.serving.run import RunInterrupted

    goodput = parse_goodput(args.goodput)
    workload = workload_of(args)  # a bad setting fails before anything loads, a bad knob too
    writable(args.json, "--json")
    others = [e.strip() for e in (args.compare or "").split(",") if e.strip()]
    knobs = {name: engine_knobs(args, name) for name in (args.engine, *others)}
    check_unused_knob_flags(args, tuple(knobs))
    # http: the local model's tokenizer only cuts the prompts as text (the server tokenizes them
    # again and reports its own counts), as vllm bench serve uses --tokenizer
    lm = load(args.model, device=args.device, dtype=args.dtype)
    try:
        res = serve(lm, workload, args.engine, goodput=goodput, knobs=knobs[args.engine])
    except RunInterrupted as stopped:  # keep what it measured, marked partial; go no further
        _report(args, stopped.result)
        raise
    _report(args, res)
    if others:
        _compare(args, lm, workload, goodput, res, {n: knobs[n] for n in others})
    if args.vs_plain:
        _vs_plain(args, lm, workload, knobs[args.engine])
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


def _compare(args, lm, workload, goodput, base, others: dict) -> None:
    from explorer.serving import serve

    print(f"\nthe same workload ({workload.num_prompts} requests) on other engines:")
    for name, knobs in others.items():
        other = serve(lm, workload, name, goodput=goodput, knobs=knobs)
        ratio = base.result["output_throughput"] / max(other.result["output_throughput"], 1e-9)
        print(
            f"  {name:<11} {other.result['output_throughput']:9.1f} output tok/s, median TTFT "
            f"{other.result['median_ttft_ms']:.1f} ms; {args.engine}/{name} throughput = {ratio:.2f}x"
        )


def _vs_plain(args, lm, workload, knobs) -> None:
    import statistics
    import time

    from explorer.serving import serve
    from explorer.serving.engines.continuous import plain_throughput

    if args.engine != "continuous":
        raise ValueError("--vs-plain compares the continuous engine with plain generate_batch")
    reqs = workload.requests(lm)
    ours, bare, plain = [], [], []

    def wall(record: bool) -> float:
        t0 = time.perf_counter()  # wall time of the whole call, manager set-up included, as plain
        res = serve(lm, workload, "continuous", record=record, knobs=knobs)
        return res.result["total_output_tokens"] / (time.perf_counter() - t0)

    for _ in range(args.repeats):  # alternating, after the run above warmed everything
        plain.append(plain_throughput(lm, reqs, knobs)["output_throughput"])
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
