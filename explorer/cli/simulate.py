"""explorer simulate: predict a serving run (this machine, fitted; or a known chip, on paper).

    explorer simulate --model arch:llama-3.1-8b --hardware h100 --tp 2 --request-rate 20 --json
    explorer simulate --validate                 # measured vs simulated on held-out workloads
    explorer bench simulate --validate --json    # the same, under bench

Without --hardware the step-time model is fitted on this machine through the real engine (cached
per model, dtype, device and library versions); with it, the chip table drives the same simulator
on paper. Every output says modelled and lists its assumptions.
"""

from __future__ import annotations

from explorer.cli.common import print_json

ORDER = 45
VALIDATE_MODELS = "bundled:target,arch:smollm2-135m"


def add(sub) -> None:
    add_simulate(sub, "simulate")


def add_simulate(sub, name: str) -> None:
    from explorer.cli.serving import add_knob_flags, add_workload_flags
    from explorer.serving.simulate.policy import modelled

    p = sub.add_parser(name, help="predict TTFT, TPOT and throughput before you buy (modelled)")
    p.add_argument("--model", default=None, help="bundled:target (default), arch:llama-3.1-8b, ...")
    p.add_argument("--engine", choices=modelled(), default="continuous")
    p.add_argument(
        "--hardware", default=None, help="a known chip: h100, h200, a100, l4, mi300x, ..."
    )
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs (with --hardware)")
    p.add_argument(
        "--dtype", default=None, help="default: bfloat16 with --hardware, else the model's"
    )
    p.add_argument("--device", default="auto")
    add_workload_flags(p)
    p.add_argument(
        "--goodput", nargs="+", default=None, metavar="SLO", help="e.g. ttft:500 tpot:50"
    )
    add_knob_flags(p, modelled())
    p.add_argument(
        "--bw-efficiency", type=float, default=None, help="--hardware: share of peak bandwidth"
    )
    p.add_argument(
        "--flop-efficiency", type=float, default=None, help="--hardware: share of peak FLOP/s"
    )
    p.add_argument(
        "--iteration-overhead-ms", type=float, default=None, help="--hardware: per iteration"
    )
    p.add_argument(
        "--measured",
        default=None,
        metavar="FILE",
        help="a measured result JSON (vllm bench serve --save-result, or ours) of the same "
        "workload: print the model's error against it",
    )
    p.add_argument(
        "--validate",
        action="store_true",
        help="measure and simulate held-out workloads on this machine; print error %%",
    )
    p.add_argument("--models", default=VALIDATE_MODELS, help="--validate: models (comma-separated)")
    p.add_argument("--refit", action="store_true", help="refit the step model (ignore the cache)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.validate:
        return _validate(args)
    from explorer.cli.serving import check_unused_knob_flags, knobs_of, workload_of
    from explorer.serving import format_summary, parse_goodput
    from explorer.serving.simulate import simulate

    goodput = parse_goodput(args.goodput)
    workload = workload_of(args)
    check_unused_knob_flags(args, (args.engine,))
    info, model, knobs, lm = _step_model(args)
    knobs = {**knobs, **knobs_of(args, args.engine)}  # a knob's flag overrides the chip's plan
    requests = workload.requests(lm) if lm is not None else None
    res = simulate(info, workload, args.engine, model, goodput=goodput, requests=requests, **knobs)
    out = {**res.to_dict(), "modelled": True, "assumptions": res.meta["assumptions"]}
    for k in ("requests", "iterations", "step_model", "generated_texts"):
        out.pop(k, None)
    rows = _against(args, res) if args.measured else None
    if args.json:
        print_json({**out, "error_vs_measured": rows} if rows is not None else out)
        return 0
    print(format_summary(res))
    print("modelled, with these assumptions:")
    for a in res.meta["assumptions"]:
        print(f"  - {a}")
    if rows:
        _print_rows(rows)
    return 0


def _step_model(args):
    """(ModelInfo, step model, engine knobs, the loaded model or None)."""
    from explorer.model.loader import arch_info, load

    if args.hardware:
        from explorer.serving.simulate.whatif import chip_model

        if args.engine != "continuous":
            raise ValueError("--hardware models a continuous-batching server (vLLM-like) only")
        name = args.model or "arch:llama-3.1-8b"
        dtype = args.dtype or "bfloat16"
        info = arch_info(name, dtype) if name.startswith("arch:") else load(name, dtype=dtype).info
        overrides = {
            k: v
            for k, v in (
                ("bw_efficiency", args.bw_efficiency),
                ("flop_efficiency", args.flop_efficiency),
                (
                    "iteration_overhead_s",
                    None
                    if args.iteration_overhead_ms is None
                    else args.iteration_overhead_ms / 1e3,
                ),
            )
            if v is not None
        }
        model, paper = chip_model(info, args.hardware, args.tp, **overrides)
        return info, model, paper["knobs"], None
    if args.tp != 1:
        raise ValueError("--tp needs --hardware (this machine is one device)")
    from explorer.serving.simulate import profile

    lm = load(args.model, device=args.device, dtype=args.dtype or "auto")
    return lm.info, profile(lm, args.engine, refit=args.refit), {}, lm


def _against(args, res) -> list[dict]:
    from explorer.serving.metrics import load_result
    from explorer.serving.simulate.validate import compare

    measured = load_result(args.measured)
    return compare(res.meta["model"], args.measured, measured, res.result)


def _print_rows(rows: list[dict]) -> None:
    print(
        f"{'model':<22}{'workload':<44}{'metric':<20}{'measured':>10}{'simulated':>11}{'error':>9}"
    )
    for r in rows:
        err = "n/a" if r["error_pct"] is None else f"{r['error_pct']:+.1f}%"
        m = "n/a" if r["measured"] is None else f"{r['measured']:.2f}"
        s = "n/a" if r["simulated"] is None else f"{r['simulated']:.2f}"
        print(f"{r['model']:<22}{r['workload'][:42]:<44}{r['metric']:<20}{m:>10}{s:>11}{err:>9}")


def _validate(args) -> int:
    from explorer.model.loader import load
    from explorer.serving.simulate.validate import summary, validate

    rows, fits = [], {}
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        lm = load(name, device=args.device, dtype=args.dtype or "auto")
        got, model = validate(lm, args.engine, refit=args.refit, progress=not args.json)
        rows.extend(got)
        fits[name] = model.summary()
    if args.json:
        print_json(rows)
        return 0
    _print_rows(rows)
    print("\nmedian |error| over the held-out workloads (target: 10% p50 and throughput, 20% p99):")
    for s in summary(rows):
        mark = "met" if s["met"] else "MISSED"
        print(f"  {s['model']:<22}{s['metric']:<20}{s['median_abs_error_pct']:6.1f}%  {mark}")
    for name, text in fits.items():
        print(f"step model {name}: {text}")
    return 0
