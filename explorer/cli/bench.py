"""explorer bench ...: benchmarks that print ratios measured side by side in one process."""

from __future__ import annotations

import sys

from explorer.cli.common import add_threads_flag, print_json, set_threads, whole, writable
from explorer.cli.simulate import add_simulate

ORDER = 40


def describe(m: dict, **kw) -> str:
    """A timed figure with its spread and noisy mark (explorer.costs.noise.describe)."""
    from explorer.costs.noise import describe as line

    return line(m, **kw)


def add(sub) -> None:
    _add_bench(sub)


def _add_bench(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks, measured side by side in one process")
    bench = p.add_subparsers(dest="bench", required=True)
    for add in BENCH_COMMANDS:
        add(bench)


def _add_bench_overhead(bench) -> None:
    p = bench.add_parser(
        "overhead", help="a fully recording greedy Session vs transformers' generate()"
    )
    p.add_argument("--model", default=None, help="bundled:target (default), arch:qwen2.5-0.5b, ...")
    p.add_argument(
        "--prompt",
        default="The return statement",
        help="prompt text (models without a tokenizer get 8 fixed token ids)",
    )
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=whole(1), default=5)
    p.add_argument(
        "--quantile",
        type=float,
        default=None,
        help="the low quantile each figure reports (default: 0.25 from 4 repeats, else the "
        "minimum; 0 = the minimum)",
    )
    p.add_argument("--warmup", type=int, default=1)
    add_threads_flag(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.set_defaults(func=_cmd_bench_overhead)


def _cmd_bench_overhead(args) -> int:
    from explorer.bench.overhead import overhead_benchmark
    from explorer.costs.noise import check_repeats
    from explorer.model.loader import load

    if args.quantile is not None:  # before loading: a bad pair fails fast, in one line
        check_repeats(args.repeats, args.quantile)
    set_threads(args.threads)
    lm = load(args.model, device=args.device, dtype=args.dtype)
    ids = lm.tokenizer(args.prompt)["input_ids"] if lm.tokenizer is not None else list(range(1, 9))
    out = overhead_benchmark(
        lm,
        ids,
        new_tokens=args.new_tokens,
        repeats=args.repeats,
        warmup=args.warmup,
        quantile=args.quantile,
    )
    if args.json:
        print_json(out)
        return 0
    g, s = out["generate"], out["session"]
    print(
        f"{out['model']} on {out['device']} ({out['dtype']}, {out['threads']} threads): {out['new_tokens']} new "
        f"tokens from a {out['prompt_tokens']}-token prompt, {out['repeats']} alternating repeats after "
        f"{out['warmup']} warm-up, {g['method']}"
    )
    for name, m in (("generate()", g), ("Session (top_n=20)", s)):
        print(f"  {name:<20} {describe(m)}")
    print(
        f"  ratio session/generate = {out['ratio']:.3f}   same greedy tokens: {out['same_tokens']}"
    )
    if out["cpu_ratio"] is not None:
        print(
            f"  ratio in process CPU time = {out['cpu_ratio']:.3f} (all timed runs; other work "
            "stretches it far less than the wall time)"
        )
    if out["recording_step_share"] is not None:
        print(
            f"  recording's share of a Session step: {100 * out['recording_step_share']:.1f}% "
            f"(median decode step: recording {out['recording_ms']:.3f} ms, forward "
            f"{out['forward_ms']:.3f} ms; timed in place in one more Session)"
        )
    if out["recording_share"] is not None:
        print(
            f"  outside the forward passes: {100 * out['recording_share']:.1f}% of a Session run's "
            "wall time (sampling chain, recording, bookkeeping, and any wait for the CPU)"
        )
    if out["noisy"]:
        print("  the ratio is noisy: read it with the NOISY reasons above")
    return 0


def _add_bench_speculative(bench) -> None:
    p = bench.add_parser(
        "speculative", help="alpha, accepted length, predicted vs measured speedup per k"
    )
    p.add_argument("--target", default="bundled:target")
    p.add_argument("--draft", default="bundled:draft")
    p.add_argument(
        "--prompt",
        default="The return statement",
        help="prompt text (models without a tokenizer: ids 1..8)",
    )
    p.add_argument("--k", default="1..8", help="a range 1..8, a list 1,2,4 or one number")
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=48,
        help="tokens per run (speculative and target-only)",
    )
    p.add_argument("--repeats", type=whole(1), default=3)
    p.add_argument(
        "--modes",
        default="greedy,sample",
        help="greedy and/or sample (plain sampling at temperature 1)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--arch-pair",
        nargs=2,
        default=None,
        metavar=("TARGET", "DRAFT"),
        help="also time the passes of two (arch:) models, e.g. arch:qwen2.5-0.5b arch:smollm2-135m, "
        "for their cost ratio c and the alpha from which the method pays off",
    )
    p.add_argument(
        "--context-len", type=int, default=64, help="cached prefix for the --arch-pair timing"
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.set_defaults(func=_cmd_bench_speculative)


def _cmd_bench_speculative(args) -> int:
    from explorer import Sampling
    from explorer.bench.speculative import benchmark, measure_cost_ratio
    from explorer.engine.drafts import parse_ks
    from explorer.model.loader import load

    ks = parse_ks(args.k)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - {"greedy", "sample"}:
        raise ValueError(f"--modes takes greedy and/or sample, got {args.modes!r}")
    target = load(args.target, device=args.device, dtype=args.dtype)
    draft = load(args.draft, device=args.device, dtype=args.dtype)
    prompt = args.prompt if target.tokenizer is not None else list(range(1, 9))
    rows = []
    for mode in modes:
        s = Sampling(greedy=True) if mode == "greedy" else Sampling(temperature=1.0, seed=args.seed)
        rows += benchmark(
            target, draft, prompt, s, ks, n_tokens=args.max_new_tokens, repeats=args.repeats
        )
    pair = None
    if args.arch_pair:
        pair = measure_cost_ratio(
            load(args.arch_pair[0], device=args.device, dtype=args.dtype),
            load(args.arch_pair[1], device=args.device, dtype=args.dtype),
            ks,
            context_len=args.context_len,
        )
    if args.json:
        print_json(
            {"target": target.info.name, "draft": draft.info.name, "rows": rows, "cost_pair": pair}
        )
        return 0
    _print_bench_speculative(target, draft, rows, pair)
    return 0


def _print_bench_speculative(target, draft, rows: list[dict], pair: dict | None) -> None:
    r0 = rows[0]
    print(
        f"target {target.info.name} vs draft {draft.info.name} on {r0['device']} ({r0['dtype']}): "
        f"{r0['n_tokens']} tokens per run, {r0['repeats']} repeats; {r0['timing']}"
    )
    print(
        "c = draft pass / target decode pass, v = verify pass (k+1 tokens) / target decode pass, both measured; "
        "predicted = (1 - a^(k+1)) / ((1 - a)(k c + 1)); with v: ... / (k c + v); "
        "measured = target-only time per token / speculative time per token (forward passes; wall: everything)"
    )
    print(
        f"{'mode':<7}{'k':>3} {'alpha':>6} {'acc/rnd':>7} {'tok/rnd':>7} {'c':>6} {'v':>6} "
        f"{'predicted':>9} {'pred(v)':>8} {'measured':>8} {'wall':>6}"
    )
    for r in rows:

        def f(x, w, d=3):
            return f"{x:>{w}.{d}f}" if x is not None else f"{'-':>{w}}"

        print(
            f"{'greedy' if r['greedy'] else 'sample':<7}{r['k']:>3} {f(r['alpha'], 6)} {f(r['mean_accepted'], 7, 2)} "
            f"{f(r['mean_tokens_per_round'], 7, 2)} {f(r['c'], 6)} {f(r['v'], 6)} {f(r['predicted'], 9)} "
            f"{f(r['predicted_with_verify_cost'], 8)} {f(r['measured'], 8)} {f(r['measured_wall'], 6)}"
        )
    if pair:
        print(
            f"\ncost pair {pair['target']} (target) vs {pair['draft']} (draft), random weights, "
            f"{pair['context_len']}-token cached prefix, {pair['timing']}:"
        )
        print(
            f"  draft pass {pair['draft_pass_s'] * 1e3:.2f} ms, target decode pass "
            f"{pair['target_decode_s'] * 1e3:.2f} ms, c = {pair['c']:.3f}"
        )
        for row in pair["per_k"]:
            a, av = row["breakeven_alpha"], row["breakeven_alpha_with_verify_cost"]
            print(
                f"  k={row['k']}: verify pass {row['verify_pass_s'] * 1e3:.2f} ms (v = {row['v']:.2f}); pays off "
                f"from alpha = {'never' if a is None else f'{a:.3f}'} (v = 1), "
                f"{'never' if av is None else f'{av:.3f}'} (measured v)"
            )


from explorer.cli.serving import add_bench_serving  # noqa: E402


def _add_bench_calibrate(bench) -> None:
    p = bench.add_parser(
        "calibrate",
        help="fit effective bandwidth, FLOP/s and per-step/per-layer overhead to measured decode "
        "steps; print the held-out error before (roofline bound) and after",
    )
    p.add_argument(
        "--model",
        action="append",
        default=None,
        help="a model to measure (repeatable; default: bundled:target, arch:smollm2-135m and "
        "arch:qwen2.5-0.5b: three shapes, so the per-step, per-layer and per-byte terms separate)",
    )
    p.add_argument("--batches", default="1,2,4,8,16", help="batch sizes of the grid")
    p.add_argument("--contexts", default="64,256,512", help="context lengths of the grid")
    p.add_argument("--repeats", type=whole(1), default=3)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--out", default=None, metavar="FILE", help="save the calibration as JSON")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_bench_calibrate)


def calibrate_models(models, *, batches, contexts, repeats, device="auto", dtype="auto"):
    """Measure the regime-map grid of each model, fit one calibration to the default train split of
    all of them (explorer.costs.calibrate.split_points) and score it on the held-out cells."""
    from explorer import sweeps
    from explorer.model.loader import load
    from explorer.sweeps.regime_map import calibration_from

    frames = {}
    for name in models:
        lm = load(name, device=device, dtype=dtype)
        frames[name] = sweeps.run(
            "regime-map", lm, batches=batches, contexts=contexts, repeats=repeats, bar=False
        )
        del lm
        if sweeps.interrupted(frames[name]):  # never a fit of part of the grid
            raise CalibrationInterrupted(name, frames)
    return calibration_from(frames.values(), refuse_busy=True), frames


class CalibrationInterrupted(KeyboardInterrupt):
    """Ctrl-C during the calibration grid: .frames holds what was measured; nothing is fitted."""

    def __init__(self, model: str, frames: dict):
        cells = sum(len(df) for df in frames.values())
        super().__init__(
            f"interrupted (Ctrl-C) during {model}'s grid: {cells} cells measured; no calibration "
            "fitted or saved"
        )
        self.frames = frames


EXIT_TOO_BUSY = 3  # explorer bench calibrate on a machine too busy to fit
DEFAULT_MODELS = ["bundled:target", "arch:smollm2-135m", "arch:qwen2.5-0.5b"]  # 6, 30, 24 layers


def _cmd_bench_calibrate(args) -> int:
    from explorer.costs.calibrate import MachineTooBusy
    from explorer.sweeps import get

    sweep = get("regime-map")
    kw = sweep.arguments(
        {"batches": args.batches, "contexts": args.contexts}, lambda p: "--" + p.name
    )
    writable(args.out, "--out")
    models = args.model or DEFAULT_MODELS
    try:
        cal, frames = calibrate_models(
            models, repeats=args.repeats, device=args.device, dtype=args.dtype, **kw
        )
    except MachineTooBusy as err:  # no fit: nothing saved, --out keeps the last good one
        kept = f"{args.out} keeps the last good fit" if args.out else "no calibration saved"
        print(f"explorer: {err}; {kept}; try again when the machine is quieter", file=sys.stderr)
        return EXIT_TOO_BUSY
    if args.out:
        cal.save(args.out)
    if args.json:
        print_json(cal.to_dict())
        return 0
    a = next(iter(frames.values())).attrs
    print(
        f"calibration on {a['device']} ({a['dtype']}, {a['threads']} threads): decode steps at batches "
        f"{kw['batches']} x contexts {kw['contexts']}, a low quantile of {args.repeats} after 1 "
        "warm-up (explorer.costs.noise), "
        f"{a['timer']}; {cal.n_train} steps fitted, {cal.n_heldout} held out"
    )
    print(f"  rule: {cal.rule}")
    print(f"  fitted: {cal.summary().split('; held-out')[0]}")
    if cal.interference.get("median_cpu_share") is not None:
        i = cal.interference
        print(
            f"  interference: on a CPU {100 * i['median_cpu_share']:.0f}% of the timed wall time "
            f"(median of {i['cells']} cells), {i['noisy_cells']} cells noisy"
        )
    for model, m in cal.per_model.items():
        print(
            f"  {model:<22} heldout_err_before_pct {m['heldout_err_before_pct']:6.1f}   "
            f"heldout_err_after_pct {m['heldout_err_after_pct']:6.1f}   ({m['n_heldout']} held-out steps)"
        )
    print(
        f"  all models            heldout_err_before_pct {cal.heldout_err_before_pct:6.1f}   "
        f"heldout_err_after_pct {cal.heldout_err_after_pct:6.1f}"
    )
    _print_identifiability(cal)
    for note in cal.notes:
        print(f"note: {note}")
    if args.out:
        print(f"saved to {args.out}")
    return 0


def _print_identifiability(cal) -> None:
    """How well the grid determines each coefficient, and the linear rule on the same points."""
    ident = cal.identifiability
    if ident:
        spread = ", ".join(
            f"{name} {100 * v:.0f}%" if v is not None else f"{name} -"
            for name, v in ident["loo_spread"].items()
        )
        print(
            f"  determined by the grid: condition number {ident['condition']:.0f}; leave-one-out "
            f"spread {spread} (reported within {100 * ident['limit']:.0f}%)"
        )
    if cal.heldout_err_linear_pct is not None:
        print(
            f"  the linear rule (bytes, FLOPs, step, layer) on the same points: held-out "
            f"{cal.heldout_err_linear_pct:.1f}% vs {cal.heldout_err_after_pct:.1f}% with this rule"
        )


def _add_bench_hooks(bench) -> None:
    p = bench.add_parser(
        "hooks",
        help="decode latency of a model that ran the inside views vs an untouched copy",
    )
    p.add_argument("--model", default=None, help="bundled:target (default), arch:qwen2.5-0.5b, ...")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=whole(1), default=7)
    p.add_argument("--json", action="store_true")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.set_defaults(func=_cmd_bench_hooks)


def _cmd_bench_hooks(args) -> int:
    from explorer.bench.inside import inside_benchmark
    from explorer.model.loader import load

    lm = load(args.model, device=args.device, dtype=args.dtype)
    out = inside_benchmark(
        lm, list(range(10, 26)), new_tokens=args.new_tokens, repeats=args.repeats
    )
    if args.json:
        print_json(out)
        return 0
    print(
        f"{out['model']} on {out['device']} ({out['dtype']}, {out['threads']} threads): "
        f"{out['new_tokens']} greedy tokens per run, {out['repeats']} alternating repeats (ABBA) after "
        f"{out['warmup']} warm-up; per-token = median of the decode Steps' latencies, then the low quantile of the runs ({out['plain']['method']})"
    )
    for name, label in (("plain", "untouched copy"), ("inside", "after lens+attention+profile")):
        print(f"  {label:<30} {describe(out[name], unit='ms/token')}")
    print(f"  ratio inside/plain = {out['ratio']:.3f}   hooks left: {out['hooks_left']}")
    return 0


def _add_bench_lookup(bench) -> None:
    p = bench.add_parser(
        "lookup", help="prompt-lookup decoding vs plain greedy on repetitive and prose prompts"
    )
    p.add_argument("--model", default=None, help="bundled:target (default), a hub id, ...")
    p.add_argument("--k", type=int, default=4, help="ids proposed per round (at most)")
    p.add_argument("--ngram", type=int, default=3, help="the longest n-gram matched first")
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--repeats", type=whole(1), default=3)
    p.add_argument("--json", action="store_true")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.set_defaults(func=_cmd_bench_lookup)


def _cmd_bench_lookup(args) -> int:
    from explorer.bench.speculative import lookup_benchmark
    from explorer.model.loader import load

    for flag in ("k", "ngram", "new_tokens", "repeats"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    lm = load(args.model, device=args.device, dtype=args.dtype)
    rows = lookup_benchmark(
        lm, k=args.k, ngram=args.ngram, new_tokens=args.new_tokens, repeats=args.repeats
    )
    if args.json:
        print_json(rows)
        return 0
    r0 = rows[0]
    print(
        f"{r0['model']} on {r0['device']}: {args.new_tokens} greedy tokens (EOS ignored), prompt "
        f"lookup k={args.k} ngram={args.ngram} vs plain decoding, a low quantile of {args.repeats} "
        f"alternating repeats after a warm-up ({r0['timer']})"
    )
    for r in rows:
        print(
            f"  {r['prompt']:<18} alpha {r['alpha']:.2f}  {r['tokens_per_round']:.2f} tokens/round  "
            f"({r['found']} of {r['rounds']} rounds found a match)  plain {r['plain_s'] * 1e3:7.1f} ms  "
            f"lookup {r['lookup_s'] * 1e3:7.1f} ms  speedup {r['speedup']:.2f}x  "
            f"greedy equal: {r['greedy_equal']}"
            + (f"  NOISY: {r['noisy_reason']}" if r.get("noisy") else "")
        )
    return 0


def _add_bench_prefix(bench) -> None:
    p = bench.add_parser("prefix", help="TTFT with and without a prefix cache of a shared prompt")
    p.add_argument("--model", default=None, help="bundled:target (default), arch:qwen2.5-0.5b, ...")
    p.add_argument("--prefix-tokens", type=int, default=256)
    p.add_argument("--repeats", type=whole(1), default=7)
    p.add_argument("--json", action="store_true")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.set_defaults(func=_cmd_bench_prefix)


def _cmd_bench_prefix(args) -> int:
    from explorer.engine.prefix import prefix_benchmark
    from explorer.model.loader import load

    lm = load(args.model, device=args.device, dtype=args.dtype)
    out = prefix_benchmark(lm, prefix_tokens=args.prefix_tokens, repeats=args.repeats)
    if args.json:
        print_json(out)
        return 0
    p, c = out["ttft_plain"], out["ttft_cached"]
    print(
        f"{out['model']} on {out['device']} ({out['dtype']}): a {out['prompt_tokens']}-token prompt whose "
        f"first {out['prefix_tokens']} tokens are cached ({out['prefix_kv_bytes'] / 1e6:.2f} MB of KV, "
        f"built once in {out['build_s'] * 1e3:.1f} ms); TTFT = Session + first step, a low quantile of "
        f"{out['repeats']} alternating repeats after a warm-up ({p['method']})"
    )
    print(f"  no prefix cache   {describe(p)}")
    print(f"  prefix cache      {describe(c)}")
    print(
        f"  speedup {out['speedup']:.2f}x   max |logit difference| {out['max_abs_logit_diff']:.2e}"
    )
    return 0


def _add_bench_simulate(bench) -> None:
    """`bench simulate`: the simulate command's flags, plus --operators."""
    add_simulate(bench, "simulate")
    p = bench.choices["simulate"]
    p.add_argument(
        "--operators",
        nargs="?",
        const="",
        default=None,
        metavar="FILE",
        help="the what-if's chip rule per operator vs Vidur's measured A100/H100 times "
        "(assets/published/vidur-operators; FILE: one operator file of ours or Vidur's mlp.csv)",
    )
    run = p.get_default("func")
    p.set_defaults(
        func=lambda args: _cmd_bench_operators(args) if args.operators is not None else run(args)
    )


def _cmd_bench_operators(args) -> int:
    from explorer.serving.simulate.operators_report import format_report, report

    other = [f"--{f}" for f in ("published", "validate", "capacity") if getattr(args, f)]
    if other:
        raise ValueError(f"--operators runs on its own: drop {', '.join(other)}")
    rep = report(args.operators or None)
    if args.json:
        print_json(rep)
    else:
        print(format_report(rep))
    return 0


BENCH_COMMANDS = [
    _add_bench_overhead,
    _add_bench_hooks,
    _add_bench_speculative,
    _add_bench_lookup,
    _add_bench_prefix,
    add_bench_serving,
    _add_bench_calibrate,
    lambda bench: _add_bench_simulate(bench),
]
