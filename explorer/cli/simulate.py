"""explorer simulate: predict a serving run (this machine, fitted; or a known chip, on paper).

    explorer simulate --model arch:llama-3.1-8b --hardware h100 --tp 2 --request-rate 20 --json
    explorer simulate --capacity --goodput ttft:500 tpot:50 --hardware h100 --input-len 512 \
        --output-len 128 --json                  # the largest steady rate meeting the SLOs
    explorer simulate --validate                 # measured vs simulated on held-out workloads
    explorer bench simulate --validate --json    # the same, under bench
    explorer bench simulate --published          # the what-if against published GPU runs

Without --hardware the step-time model is fitted on this machine through the real engine (cached
per model, dtype, device and library versions); with it, the chip table drives the same simulator
on paper. Every output says modelled and lists its assumptions.
"""

from __future__ import annotations

import math

from explorer._format import number, pct
from explorer.cli._capacity import check_capacity_flags, check_capacity_lengths
from explorer.cli.common import print_json, whole
from explorer.costs.kvdtype import KV_DTYPE_HELP, KV_DTYPES

ORDER = 45
VALIDATE_MODELS = "bundled:target,arch:smollm2-135m"


def add(sub) -> None:
    add_simulate(sub, "simulate")


def add_simulate(sub, name: str) -> None:
    from explorer.cli.serving import add_knob_flags, add_workload_flags
    from explorer.serving.simulate.policy import knob_table, modelled

    p = sub.add_parser(name, help="predict TTFT, TPOT and throughput before you buy (modelled)")
    p.add_argument("--model", default=None, help="bundled:target (default), arch:llama-3.1-8b, ...")
    p.add_argument(
        "--engine",
        default="continuous",
        help=f"the scheduler: {', '.join(modelled())} (vllm, vllm-v0, sglang, trtllm: the "
        "served engines' own, with --hardware)",
    )
    p.add_argument("--hardware", default=None, help=f"a known chip: {', '.join(_chips())}")
    _add_gpu_flags(p)
    p.add_argument(
        "--dtype",
        default=None,
        help="weights: default bfloat16 with --hardware (fp8 there: FP8 matmul weights and FLOP/s), "
        "else the model's",
    )
    p.add_argument(
        "--kv-dtype", default=None, choices=KV_DTYPES, help="--hardware: " + KV_DTYPE_HELP
    )
    p.add_argument(
        "--expert-parallel",
        action="store_true",
        help="--hardware, a mixture of experts: split its experts whole across the --tp GPUs",
    )
    p.add_argument("--device", default="auto")
    add_workload_flags(p)
    p.add_argument(
        "--goodput", nargs="+", default=None, metavar="SLO", help="e.g. ttft:500 tpot:50"
    )
    add_knob_flags(p, modelled(), knob_table(modelled()))
    p.add_argument(
        "--capacity",
        action="store_true",
        help="the largest Poisson rate that is steady and meets every --goodput SLO at p99 "
        "(bisected to 2%%; runs from max(--num-prompts, 200) requests, doubled until the p99s "
        "settle); --hardware (default h100)",
    )
    p.add_argument(
        "--gpu-hour-usd", type=float, default=2.5, help="--capacity: price per GPU-hour (USD)"
    )
    p.add_argument(
        "--bw-efficiency", type=float, default=None, help="--hardware: share of peak bandwidth"
    )
    p.add_argument(
        "--flop-efficiency", type=float, default=None, help="--hardware: share of peak FLOP/s"
    )
    p.add_argument(
        "--iteration-overhead-ms", type=float, default=None, help="--hardware: per iteration"
    )
    _add_check_flags(p)
    p.add_argument("--refit", action="store_true", help="refit the step model (ignore the cache)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def _add_check_flags(p) -> None:
    """The flags that check the model against measurements: a measured result, held-out workloads
    measured here, published GPU runs (and refitting on them)."""
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
    p.add_argument(
        "--published",
        action="store_true",
        help="simulate published GPU runs (assets/published) with the what-if; print error %%",
    )
    p.add_argument(
        "--fit",
        action="store_true",
        help="--published: refit the what-if's efficiencies on the fitted sources and print them",
    )
    p.add_argument(
        "--save",
        action="store_true",
        help="--published: store the comparison (assets/published/validation.json), which "
        "`explorer simulate --hardware` and the Capacity tab show beside every answer",
    )
    p.add_argument("--models", default=VALIDATE_MODELS, help="--validate: models (comma-separated)")
    p.add_argument(
        "--repeats",
        type=whole(1),
        default=1,
        help="--validate: measure each held-out workload N times (their median compared, their "
        "spread shown beside each error; a miss inside it is named as such); default 1",
    )


def _add_gpu_flags(p) -> None:
    """--tp and --replicas (explorer.serving.simulate.whatif_settings.Deployment)."""
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs (with --hardware)")
    p.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="independent copies behind a round-robin load balancer, each --tp GPUs",
    )
    p.add_argument(
        "--check-prompts",
        type=whole(1),
        default=None,
        help="--capacity: requests per seed in the runs that accept a rate (default 8,000: long "
        "enough for a p99 to settle near capacity; fewer answer sooner and less surely)",
    )


def _lab_engines() -> list[str]:
    """The simulated engines that also run on this machine (their step model fitted here)."""
    from explorer.serving import engines
    from explorer.serving.simulate.policy import modelled

    return [n for n in modelled() if n in engines.ENGINES]


def _chips() -> list[str]:
    from explorer.costs.hardware import KNOWN_CHIPS

    return [c.short_name for c in KNOWN_CHIPS.values()]


def run(args) -> int:
    from explorer.serving.simulate.policy import policy_class

    policy_class(args.engine)  # one line listing the engines it models
    if args.validate:
        return _validate(args)
    if args.repeats != 1:
        raise ValueError("--repeats goes with --validate (it repeats the measured runs)")
    if args.published:
        return _published(args)
    if args.capacity:
        return _capacity(args)
    if args.check_prompts is not None:
        raise ValueError("--check-prompts goes with --capacity")
    from explorer.cli.serving import check_unused_knob_flags, knobs_of, workload_of
    from explorer.serving import format_summary, parse_goodput
    from explorer.serving.simulate import simulate

    goodput = parse_goodput(args.goodput)
    workload = workload_of(args)
    from explorer.serving.simulate.policy import knob_table, modelled

    check_unused_knob_flags(args, (args.engine,), knob_table(modelled()))
    info, model, knobs, lm = _step_model(args)
    knobs = {**knobs, **knobs_of(args, args.engine)}  # a knob's flag overrides the chip's plan
    requests = workload.requests(lm) if lm is not None else None
    if args.hardware:
        from explorer.serving.simulate.whatif import check_context

        requests = workload.requests(vocab_size=info.vocab_size)
        check_context(info, requests)
    opts = dict(goodput=goodput, requests=requests, replicas=args.replicas)
    res = simulate(info, workload, args.engine, model, **opts, **knobs)
    out = {**res.to_dict(), "modelled": True, "assumptions": res.meta["assumptions"]}
    for k in ("requests", "iterations", "step_model", "generated_texts"):
        out.pop(k, None)
    if args.hardware:
        s = _published_summary()
        out["error_vs_published"] = None if s is None else s["summary"]
    rows = _against(args, res) if args.measured else None
    if args.json:
        print_json({**out, "error_vs_measured": rows} if rows is not None else out)
        return 0
    print(format_summary(res))
    print(res.result["stability"])
    print("modelled, with these assumptions:")
    for a in res.meta["assumptions"]:
        print(f"  - {a}")
    if rows:
        _print_rows(rows)
    if args.hardware:
        _print_published_summary()
    return 0


def _published_summary() -> dict | None:
    from explorer.serving.simulate.published import validation_summary

    return validation_summary(compute=False)


def _print_published_summary() -> None:
    from explorer.serving.simulate.published import summary_text

    s = _published_summary()
    if s is None:
        print("no stored comparison with published runs: `explorer bench simulate --published`")
    else:
        print(summary_text(s))


CAPACITY_KEYS = (
    "largest_rate",
    "output_throughput",
    "p99_ttft_ms",
    "p99_tpot_ms",
    "utilization",
    "steady",
    "request_goodput",
    "steady_output_throughput",
    "cost_per_million_output_tokens_usd",
    "capacity_rps_modelled",
)


def _capacity(args) -> int:
    """--capacity: the search of explorer.serving.simulate.capacity, one answer."""
    from explorer.serving import parse_goodput
    from explorer.serving.metrics import SLO_NAMES
    from explorer.serving.simulate.capacity import capacity, cost_per_million

    slos = parse_goodput(args.goodput)
    if not slos:
        raise ValueError(f"--capacity needs --goodput SLOs ({', '.join(SLO_NAMES)}), e.g. ttft:500")
    if not (args.gpu_hour_usd > 0 and math.isfinite(args.gpu_hour_usd)):
        raise ValueError(f"--gpu-hour-usd must be a number > 0, got {args.gpu_hour_usd}")
    check_capacity_flags(args)
    args.hardware = args.hardware or "h100"
    info, model, _, _ = _step_model(args)
    check_capacity_lengths(args, info)
    ans = capacity(
        info,
        args.hardware,
        tp=args.tp,
        replicas=args.replicas,
        input_len=args.input_len,
        output_len=args.output_len,
        slos=slos,
        num_prompts=max(args.num_prompts, 200),
        **({"check_prompts": args.check_prompts} if args.check_prompts else {}),
        engine=args.engine,
        **_overrides(args),
        **_precision(args),
    )
    best = ans["largest_rate"] is not None
    ans["gpu_hour_usd"] = args.gpu_hour_usd
    ans["cost_per_million_output_tokens_usd"] = (
        cost_per_million(ans, args.tp * args.replicas, args.gpu_hour_usd) if best else None
    )
    if args.json:
        print_json(ans)
        return 0
    if not best:
        print(ans["refused"] or "not even the lowest rate tried is steady and meets the SLOs")
    for k in CAPACITY_KEYS:
        print(f"{k:>36}: {ans[k]}")
    print("modelled, with these assumptions:")
    for a in ans["assumptions"]:
        print(f"  - {a}")
    return 0


def _overrides(args) -> dict:
    """The what-if settings given on the command line."""
    pairs = (
        ("bw_efficiency", args.bw_efficiency),
        ("flop_efficiency", args.flop_efficiency),
        (
            "iteration_overhead_s",
            None if args.iteration_overhead_ms is None else args.iteration_overhead_ms / 1e3,
        ),
    )
    out = {k: v for k, v in pairs if v is not None}
    if getattr(args, "expert_parallel", False):
        out["expert_parallel"] = True
    return out


def _precision(args) -> dict:
    """--dtype and --kv-dtype as the what-if's chip_model takes them (the capacity search too)."""
    from explorer.costs.hardware import chip_dtype

    out = {"dtype": chip_dtype(args.dtype or "bfloat16")}
    if args.kv_dtype:
        out["kv_dtype"] = args.kv_dtype
    return out


def _step_model(args):
    """(ModelInfo, step model, engine knobs, the loaded model or None)."""
    from explorer.model.loader import arch_info, load

    if args.hardware:
        from explorer.serving.simulate.engine_policies import chip_knobs
        from explorer.serving.simulate.whatif import chip_model

        name = args.model or "arch:llama-3.1-8b"
        dtype = _precision(args)["dtype"]
        built = "bfloat16" if dtype == "fp8" else dtype  # fp8: the what-if sets the bytes
        info = arch_info(name, built) if name.startswith("arch:") else load(name, dtype=built).info
        model, paper = chip_model(
            info, args.hardware, args.tp, dtype=dtype, kv_dtype=args.kv_dtype,
            engine=args.engine, **_overrides(args),
        )  # fmt: skip
        return info, model, chip_knobs(args.engine, paper, args.hardware), None
    if args.engine not in _lab_engines():
        raise ValueError(
            f"--engine {args.engine} is a served engine's scheduler: give --hardware (a known "
            "chip, e.g. h100); on this machine the simulator models "
            f"{', '.join(_lab_engines())}"
        )
    if args.tp != 1:
        raise ValueError("--tp needs --hardware (this machine is one device)")
    if args.kv_dtype:
        raise ValueError("--kv-dtype needs --hardware (the what-if on a known chip)")
    if args.expert_parallel:
        raise ValueError("--expert-parallel needs --hardware (the what-if on a known chip)")
    from explorer.serving.simulate import profile

    lm = load(args.model, device=args.device, dtype=args.dtype or "auto")
    return lm.info, profile(lm, args.engine, refit=args.refit), {}, lm


def _against(args, res) -> list[dict]:
    from explorer.serving.metrics import load_result
    from explorer.serving.simulate.validate import compare

    measured = load_result(args.measured)
    return compare(res.meta["model"], args.measured, measured, res.result)


def _print_rows(rows: list[dict]) -> None:
    spread = any(r.get("spread_pct") is not None for r in rows)  # measured more than once
    print(
        f"{'model':<22}{'workload':<44}{'metric':<20}{'measured':>10}{'simulated':>11}{'error':>9}"
        + (f"{'spread':>9}" if spread else "")
    )
    for r in rows:
        err, m, s = pct(r["error_pct"], "+.1f"), number(r["measured"]), number(r["simulated"])
        line = f"{r['model']:<22}{r['workload'][:42]:<44}{r['metric']:<20}{m:>10}{s:>11}{err:>9}"
        if spread:
            line += f"{pct(r.get('spread_pct'), '.1f'):>9}"
        print(line + (f"  ({r['note']})" if r.get("note") else ""))


def _validate(args) -> int:
    from explorer.model.loader import load
    from explorer.serving.simulate.validate import SPREAD_RULE, summary, validate

    rows, fits = [], {}
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        lm = load(name, device=args.device, dtype=args.dtype or "auto")
        got, model = validate(
            lm, args.engine, refit=args.refit, progress=not args.json, repeats=args.repeats
        )
        rows.extend(got)
        fits[name] = model.summary()
    if args.json:
        print_json(rows)
        return 0
    _print_rows(rows)
    print("\nmedian |error| over the held-out workloads (target: 10% p50 and throughput, 20% p99):")
    for s in summary(rows):
        print(f"  {s['model']:<22}{s['metric']:<20}{s['median_abs_error_pct']:6.1f}%  {_mark(s)}")
    if args.repeats > 1:
        print(f"each workload measured {args.repeats} times; {SPREAD_RULE}")
    for name, text in fits.items():
        print(f"step model {name}: {text}")
    return 0


def _mark(s: dict) -> str:
    """met / MISSED for one metric's summary, and how many workloads' misses lie within the
    measurement's own spread (when the workloads were measured more than once)."""
    mark = "met" if s["met"] else "MISSED"
    if s.get("spread_measured") and s["misses"]:
        mark += (
            f" ({s['misses_within_spread']} of {s['misses']} workloads' misses within the "
            "measurement's own spread)"
        )
    return mark


def _published(args) -> int:
    import sys
    from dataclasses import asdict

    from explorer.serving.simulate import fit, published

    say = None if args.json else (lambda text: print(f"  {text}", file=sys.stderr, flush=True))
    if args.fit:
        result = fit.fit(published.load()["points"], progress=say)
        if args.json:
            print_json(asdict(result))
        else:
            print("\n".join(fit.report_lines(result)))
        return 0
    s = published.validation_summary(compute=True, progress=say, save=args.save)
    if args.json:
        print_json(s)
        return 0
    from explorer.serving.simulate.published_report import report_text

    _print_published_rows(s["rows"])
    print()
    print(published.summary_text(s))
    print()
    print(report_text(s["report"]))
    print(f"what-if settings: {s['settings']}")
    return 0


def _print_published_rows(rows: list[dict]) -> None:
    print(
        f"{'run':<34}{'split':<9}{'chip':<10}{'policy':<9}{'metric':<19}{'measured':>10}"
        f"{'simulated':>11}{'error':>9}"
    )
    for r in rows:
        err, s = pct(r["error_pct"], "+.1f"), number(r["simulated"], ".4g")
        print(
            f"{r['id'][:33]:<34}{r['split']:<9}{r['chip']:<10}{r.get('policy', '?'):<9}"
            f"{r['metric']:<19}{r['measured']:>10.4g}{s:>11}{err:>9}"
        )
