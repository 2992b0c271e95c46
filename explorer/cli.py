"""`explorer` command line: the same core as the notebooks and the dashboard.

Each subcommand is one `_add_<name>(subparsers)` function that registers its parser and sets
`func`; main() only dispatches. Errors the user can fix print one clear line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2, default=str))


# --- explorer info -------------------------------------------------------------------------------


def _add_info(sub) -> None:
    p = sub.add_parser("info", help="facts about a model (parameters, layers, heads, bytes)")
    p.add_argument("model", nargs="?", default=None, help="bundled:target (default), bundled:draft, arch:NAME, hub id or path")
    p.add_argument("--list", action="store_true", help="list every offline model name")
    p.add_argument("--json", action="store_true")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.set_defaults(func=_cmd_info)


def _cmd_info(args) -> int:
    from explorer.loading import arch_info, available_models, load

    if args.list:
        names = available_models()
        _print_json(names) if args.json else print("\n".join(names))
        return 0
    name = args.model or "bundled:target"
    big = name.startswith("arch:") and name not in ("arch:gpt2", "arch:smollm2-135m", "arch:qwen2.5-0.5b")
    info = arch_info(name) if big else load(name, device=args.device, dtype=args.dtype).info
    if args.json:
        _print_json(info.to_dict())
        return 0
    for key, value in info.to_dict().items():
        print(f"{key:>26}  {value:,}" if isinstance(value, int) and not isinstance(value, bool) else f"{key:>26}  {value}")
    print(f"{'kv_bytes_per_token':>26}  {info.kv_bytes_per_token:,}")
    if big:
        print("(shape only: built on the meta device, no memory allocated)")
    return 0


# --- explorer app --------------------------------------------------------------------------------


def _add_app(sub) -> None:
    p = sub.add_parser("app", help="serve the dashboard with Voila on 127.0.0.1 (preheated kernels, idle culling)")
    p.add_argument("--port", type=int, default=8866)
    p.add_argument("--ip", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--shared", action="store_true",
                   help="classroom mode: no free-text model box, models from --models-config; prints the capacity")
    p.add_argument("--models-config", default=None, metavar="FILE",
                   help='JSON allow-list for --shared: {"models": ["bundled:target", ...]}')
    p.add_argument("--pool-size", type=int, default=1, metavar="N", help="preheated kernels kept ready (0: none)")
    p.add_argument("--cull-idle-timeout", type=int, default=120, metavar="S",
                   help="reclaim a kernel S seconds after its tab closed (default 120)")
    p.add_argument("--refill-delay", type=float, default=8.0, metavar="S",
                   help="start a taken kernel's replacement S seconds later (default 8)")
    p.add_argument("--notebook", default=None, help="serve another notebook instead of notebooks/dashboard.ipynb")
    p.add_argument("--no-browser", action="store_true", help="do not open a browser tab")
    p.add_argument("--threads", type=int, default=0, metavar="N",
                   help="torch CPU threads per kernel (default 0: cores - 1, leaving one to the browser)")
    p.set_defaults(func=_cmd_app)


def _cmd_app(args) -> int:
    from explorer.app.serve import AppConfig, serve

    config = AppConfig(port=args.port, ip=args.ip, shared=args.shared, models_config=args.models_config,
                       pool_size=args.pool_size, cull_idle_timeout=args.cull_idle_timeout,
                       refill_delay=args.refill_delay, notebook=args.notebook, open_browser=not args.no_browser,
                       threads=args.threads)
    return serve(config)


# --- explorer generate ---------------------------------------------------------------------------


def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help="generate step by step, one forward pass per token, every step recorded")
    p.add_argument("--model", default=None, help="bundled:target (default), bundled:draft, arch:NAME, hub id or path")
    p.add_argument("--prompt", default=None, help="the prompt text ('' starts from BOS)")
    p.add_argument("--prompt-ids", default=None, metavar="IDS",
                   help="comma-separated token ids instead of --prompt (for models without a tokenizer)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    _add_sampling_flags(p)
    p.add_argument("--no-cache", action="store_true", help="feed the whole sequence every step (no KV cache)")
    p.add_argument("--top-n", type=int, default=20, help="most likely tokens recorded per step")
    p.add_argument("--no-roofline", action="store_true", help="skip measuring this machine's peaks")
    p.add_argument("--json", action="store_true", help="print the Trace as JSON instead of the table")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.set_defaults(func=_cmd_generate)


def _prompt_arg(args):
    if args.prompt_ids is not None:
        try:
            return [int(t) for t in args.prompt_ids.split(",") if t.strip()]
        except ValueError as err:
            raise ValueError(f"--prompt-ids must be comma-separated whole numbers, got {args.prompt_ids!r}") from err
    if args.prompt is None:
        raise ValueError("give --prompt TEXT (or --prompt-ids 1,2,3)")
    return args.prompt


def _cmd_generate(args) -> int:
    from explorer import Sampling
    from explorer.engine import Session
    from explorer.loading import load

    sampling = Sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                        repetition_penalty=args.repetition_penalty, seed=args.seed, greedy=args.greedy)
    prompt = _prompt_arg(args)
    lm = load(args.model, device=args.device, dtype=args.dtype)
    session = Session(lm, prompt, sampling, use_cache=not args.no_cache, top_n=args.top_n,
                      max_new_tokens=args.max_new_tokens, roofline=not args.no_roofline)
    if args.json:
        session.run()
        print(session.trace.to_json(indent=2))
        return 0
    print(f"{lm.info.name} on {session.device} ({lm.info.dtype}), cache {'off' if args.no_cache else 'on'}; "
          f"prob = final probability of the chosen token, entropy of the final distribution in nats")
    print(f"{'step':>4}  {'phase':<7} {'fed':>4}  {'token':<16} {'prob':>7} {'entropy':>7} "
          f"{'latency ms':>10} {'KV bytes':>11}")
    for st in session:
        token = repr(st.token_text)[:16] + ("*" if st.forced else "")
        print(f"{st.index:>4}  {st.phase:<7} {st.tokens_fed:>4}  {token:<16} {st.prob_final:>7.3f} "
              f"{st.entropy_final:>7.3f} {st.latency_s * 1e3:>10.2f} {st.kv_cache_bytes:>11,}")
    print(f"stop: {session.stop_reason}")
    print(f"text: {session.text!r}")
    return 0


# --- explorer bench ... --------------------------------------------------------------------------


def _add_bench(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks, measured side by side in one process")
    bench = p.add_subparsers(dest="bench", required=True)
    for add in BENCH_COMMANDS:
        add(bench)


def _add_bench_overhead(bench) -> None:
    p = bench.add_parser("overhead", help="a fully recording greedy Session vs transformers' generate()")
    p.add_argument("--model", default=None, help="bundled:target (default), arch:qwen2.5-0.5b, ...")
    p.add_argument("--prompt", default="The return statement",
                   help="prompt text (models without a tokenizer get 8 fixed token ids)")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for torch (default: torch's choice); 1 is steadier on a shared machine")
    p.add_argument("--json", action="store_true")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.set_defaults(func=_cmd_bench_overhead)


def _cmd_bench_overhead(args) -> int:
    from explorer.engine import overhead_benchmark
    from explorer.loading import load

    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        import torch

        torch.set_num_threads(args.threads)
    lm = load(args.model, device=args.device, dtype=args.dtype)
    ids = lm.tokenizer(args.prompt)["input_ids"] if lm.tokenizer is not None else list(range(1, 9))
    out = overhead_benchmark(lm, ids, new_tokens=args.new_tokens, repeats=args.repeats, warmup=args.warmup)
    if args.json:
        _print_json(out)
        return 0
    g, s = out["generate"], out["session"]
    print(f"{out['model']} on {out['device']} ({out['dtype']}, {out['threads']} threads): {out['new_tokens']} new "
          f"tokens from a {out['prompt_tokens']}-token prompt, {out['repeats']} alternating repeats after "
          f"{out['warmup']} warm-up, {g['method']}")
    for name, m in (("generate()", g), ("Session (top_n=20)", s)):
        print(f"  {name:<20} median {m['median_s'] * 1e3:9.1f} ms  (min {m['min_s'] * 1e3:.1f}, "
              f"max {m['max_s'] * 1e3:.1f})  {m['median_s'] * 1e3 / out['new_tokens']:.2f} ms/token")
    print(f"  ratio session/generate = {out['ratio']:.3f}   same greedy tokens: {out['same_tokens']}")
    return 0


# --- explorer speculate / bench speculative ------------------------------------------------------


def _add_sampling_flags(p) -> None:
    p.add_argument("--temperature", type=float, default=1.0, help="0 means greedy")
    p.add_argument("--top-k", type=int, default=0, help="0 = off (generate() would silently use 50)")
    p.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    p.add_argument("--min-p", type=float, default=0.0, help="0 = off")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="1 = off")
    p.add_argument("--greedy", action="store_true", help="argmax instead of sampling")
    p.add_argument("--seed", type=int, default=None)


def _sampling_of(args):
    from explorer import Sampling

    return Sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                    repetition_penalty=args.repetition_penalty, seed=args.seed, greedy=args.greedy)


def _add_speculate(sub) -> None:
    p = sub.add_parser("speculate", help="speculative decoding round by round: draft proposals, verdicts, residual")
    p.add_argument("--target", default="bundled:target", help="the model whose distribution is kept")
    p.add_argument("--draft", default="bundled:draft", help="the cheap proposer (same tokenizer as the target)")
    p.add_argument("--prompt", default=None, help="the prompt text")
    p.add_argument("--prompt-ids", default=None, metavar="IDS", help="comma-separated token ids instead of --prompt")
    p.add_argument("--k", type=int, default=4, help="draft tokens proposed per round")
    p.add_argument("--adaptive", action="store_true", help="grow k after a full acceptance, shrink after a rejection")
    p.add_argument("--max-new-tokens", type=int, default=32)
    _add_sampling_flags(p)
    p.add_argument("--top-n", type=int, default=5, help="entries kept of each residual distribution")
    p.add_argument("--json", action="store_true", help="print rounds, tokens and statistics as JSON")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.set_defaults(func=_cmd_speculate)


def _cmd_speculate(args) -> int:
    from explorer.loading import load
    from explorer.speculative import SpeculativeSession, check_k

    check_k(args.k)
    sampling, prompt = _sampling_of(args), _prompt_arg(args)
    target = load(args.target, device=args.device, dtype=args.dtype)
    draft = load(args.draft, device=args.device, dtype=args.dtype)
    session = SpeculativeSession(target, draft, prompt, sampling, k=args.k, top_n=args.top_n,
                                 max_new_tokens=args.max_new_tokens, adaptive=args.adaptive, record_steps=False)
    if args.json:
        session.run(args.max_new_tokens)
        _print_json({"target": target.info.name, "draft": draft.info.name, "prompt_ids": session.prompt_ids,
                     "settings": session.trace.settings | {"draft_model": draft.info.name},
                     "tokens": session.tokens, "text": session.text, "stop_reason": session.stop_reason,
                     "stats": session.stats(), "rounds": [r.to_dict() for r in session.rounds]})
        return 0
    print(f"target {target.info.name}, draft {draft.info.name} on {target.device} ({target.info.dtype}); "
          f"{'greedy' if sampling.is_greedy else 'sampling'}, k={args.k}{' adaptive' if args.adaptive else ''}")
    print("a draft token is kept with probability min(1, p/q); + kept, x rejected, . not tested")
    print(f"{'round':>5} {'k':>2}  {'drafts':<44} {'emitted':<28} {'draft ms':>8} {'verify ms':>9}")
    for r in session:
        marks = {True: "+", False: "x", None: "."}
        drafts = " ".join(f"{marks[d['accepted']]}{d['text']!r}" for d in r.drafts)
        tail = "residual" if r.residual else "bonus"
        print(f"{r.index:>5} {r.k:>2}  {drafts[:44]:<44} {repr(''.join(r.texts))[:20]:<20} +{tail:<7} "
              f"{r.draft_s * 1e3:>8.2f} {r.verify_s * 1e3:>9.2f}")
    st = session.stats()
    print(f"stop: {session.stop_reason}; {st['emitted']} tokens in {st['rounds']} rounds "
          f"({st['mean_tokens_per_round']:.2f} per round, {st['verify_passes']} target passes)")
    if st["alpha"] is not None:
        print(f"alpha (accepted / tested) = {st['alpha']:.3f}, from the distributions sum min(p, q) = "
              f"{st['alpha_overlap']:.3f}; mean accepted {st['mean_accepted']:.2f}; accepted-length histogram "
              f"{st['accepted_histogram']}")
    print(f"text: {session.text!r}")
    return 0


def _add_bench_speculative(bench) -> None:
    p = bench.add_parser("speculative", help="alpha, accepted length, predicted vs measured speedup per k")
    p.add_argument("--target", default="bundled:target")
    p.add_argument("--draft", default="bundled:draft")
    p.add_argument("--prompt", default="The return statement", help="prompt text (models without a tokenizer: ids 1..8)")
    p.add_argument("--k", default="1..8", help="a range 1..8, a list 1,2,4 or one number")
    p.add_argument("--max-new-tokens", type=int, default=48, help="tokens per run (speculative and target-only)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--modes", default="greedy,sample", help="greedy and/or sample (plain sampling at temperature 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arch-pair", nargs=2, default=None, metavar=("TARGET", "DRAFT"),
                   help="also time the passes of two (arch:) models, e.g. arch:qwen2.5-0.5b arch:smollm2-135m, "
                        "for their cost ratio c and the alpha from which the method pays off")
    p.add_argument("--context-len", type=int, default=64, help="cached prefix for the --arch-pair timing")
    p.add_argument("--json", action="store_true")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.set_defaults(func=_cmd_bench_speculative)


def _cmd_bench_speculative(args) -> int:
    from explorer import Sampling
    from explorer.loading import load
    from explorer.speculative import benchmark, measure_cost_ratio, parse_ks

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
        rows += benchmark(target, draft, prompt, s, ks, n_tokens=args.max_new_tokens, repeats=args.repeats)
    pair = None
    if args.arch_pair:
        pair = measure_cost_ratio(load(args.arch_pair[0], device=args.device, dtype=args.dtype),
                                  load(args.arch_pair[1], device=args.device, dtype=args.dtype), ks,
                                  context_len=args.context_len)
    if args.json:
        _print_json({"target": target.info.name, "draft": draft.info.name, "rows": rows, "cost_pair": pair})
        return 0
    _print_bench_speculative(target, draft, rows, pair)
    return 0


def _print_bench_speculative(target, draft, rows: list[dict], pair: dict | None) -> None:
    r0 = rows[0]
    print(f"target {target.info.name} vs draft {draft.info.name} on {r0['device']} ({r0['dtype']}): "
          f"{r0['n_tokens']} tokens per run, {r0['repeats']} repeats; {r0['timing']}")
    print("c = draft pass / target decode pass, v = verify pass (k+1 tokens) / target decode pass, both measured; "
          "predicted = (1 - a^(k+1)) / ((1 - a)(k c + 1)); with v: ... / (k c + v); "
          "measured = target-only time per token / speculative time per token (forward passes; wall: everything)")
    print(f"{'mode':<7}{'k':>3} {'alpha':>6} {'acc/rnd':>7} {'tok/rnd':>7} {'c':>6} {'v':>6} "
          f"{'predicted':>9} {'pred(v)':>8} {'measured':>8} {'wall':>6}")
    for r in rows:
        def f(x, w, d=3):
            return f"{x:>{w}.{d}f}" if x is not None else f"{'-':>{w}}"

        print(f"{'greedy' if r['greedy'] else 'sample':<7}{r['k']:>3} {f(r['alpha'], 6)} {f(r['mean_accepted'], 7, 2)} "
              f"{f(r['mean_tokens_per_round'], 7, 2)} {f(r['c'], 6)} {f(r['v'], 6)} {f(r['predicted'], 9)} "
              f"{f(r['predicted_with_verify_cost'], 8)} {f(r['measured'], 8)} {f(r['measured_wall'], 6)}")
    if pair:
        print(f"\ncost pair {pair['target']} (target) vs {pair['draft']} (draft), random weights, "
              f"{pair['context_len']}-token cached prefix, {pair['timing']}:")
        print(f"  draft pass {pair['draft_pass_s'] * 1e3:.2f} ms, target decode pass "
              f"{pair['target_decode_s'] * 1e3:.2f} ms, c = {pair['c']:.3f}")
        for row in pair["per_k"]:
            a, av = row["breakeven_alpha"], row["breakeven_alpha_with_verify_cost"]
            print(f"  k={row['k']}: verify pass {row['verify_pass_s'] * 1e3:.2f} ms (v = {row['v']:.2f}); pays off "
                  f"from alpha = {'never' if a is None else f'{a:.3f}'} (v = 1), "
                  f"{'never' if av is None else f'{av:.3f}'} (measured v)")


BENCH_COMMANDS = [_add_bench_overhead, _add_bench_speculative]


# --- explorer hardware / cost / sweep (costs, hardware, experiments) ----------------------------


def _add_hardware(sub) -> None:
    p = sub.add_parser("hardware", help="measured peaks of this machine (bandwidth, matmul FLOP/s) + known chips")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", help="dtype of the matmul peak (auto: float32 on CPU)")
    p.add_argument("--thorough", action="store_true", help="larger buffers and more repeats (slower)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_hardware)


def _cmd_hardware(args) -> int:
    from dataclasses import asdict

    from explorer import hardware
    from explorer.loading import resolve_device, resolve_dtype

    dev = resolve_device(args.device)
    peaks = hardware.measure(dev, resolve_dtype(args.dtype, dev), thorough=args.thorough)
    if args.json:
        _print_json({"measured": peaks.to_dict(), "known_chips_modelled": [asdict(c) for c in hardware.KNOWN_CHIPS.values()]})
        return 0
    d = peaks.details
    print(f"measured on {peaks.device} ({peaks.dtype}, {d['threads']} threads, median of {d['bandwidth_repeats']} "
          f"(bandwidth) / {d['repeats']} (matmul) after {d['warmup']} warm-up, {d['timer']}, "
          f"load average {d['load_average']}):")
    print(f"  copy        {peaks.copy_gbps:8.1f} GB/s   ({d['buffer_bytes'] >> 20} MiB copy, read + write counted)")
    print(f"  read        {peaks.read_gbps:8.1f} GB/s   ({d['buffer_bytes'] >> 20} MiB matrix-vector product)")
    if peaks.cache_gbps:
        print(f"  cache       {peaks.cache_gbps:8.1f} GB/s   (best, buffer 1/4 of the {peaks.cache_bytes >> 20} MiB "
              "last-level cache)")
    print(f"  matmul      {peaks.flops / 1e9:8.1f} GFLOP/s ({d['matmul_n']}^3 {peaks.dtype})")
    print(f"  roofline    {peaks.bound_gbps:8.1f} GB/s, {peaks.roofline_flops / 1e9:.1f} GFLOP/s (best repeats)")
    print("\nknown chips (vendor figures; modelled wherever used):")
    print(f"  {'chip':<14} {'GB/s':>7} {'bf16 TFLOP/s':>13} {'fp32 TFLOP/s':>13}  source")
    for c in hardware.KNOWN_CHIPS.values():
        bf16 = "-" if c.bf16_tflops is None else f"{c.bf16_tflops:g}"
        print(f"  {c.name:<14} {c.bandwidth_gbps:>7g} {bf16:>13} {c.fp32_tflops:>13g}  {c.source}")
    return 0


def _cost_info(name: str, device: str, dtype: str):
    """ModelInfo without allocating for arch: shapes (meta device); other names are loaded."""
    from explorer.loading import arch_info, load, resolve_device, resolve_dtype

    if name.startswith("arch:"):
        return arch_info(name, str(resolve_dtype(dtype, resolve_device(device))).replace("torch.", ""))
    return load(name, device=device, dtype=dtype).info


def _add_cost(sub) -> None:
    p = sub.add_parser("cost", help="modelled FLOPs and bytes of one forward pass, by part, and its roofline")
    p.add_argument("--model", default="bundled:target", help="bundled:target (default), arch:NAME, hub id or path")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--context", type=int, default=128, help="context length L (cached prefix + fed tokens)")
    p.add_argument("--tokens-fed", type=int, default=1, help="tokens fed per row (1 = a decode step; L = prefill)")
    p.add_argument("--no-cache", action="store_true", help="no KV cache: the whole context is fed")
    p.add_argument("--chip", default=None, help="model the bound on a known chip (see `explorer hardware`)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_cost)


def _cmd_cost(args) -> int:
    from explorer import costs, hardware

    info = _cost_info(args.model, args.device, args.dtype)
    fed = args.context if args.no_cache else args.tokens_fed
    cost = costs.forward_cost(info, batch=args.batch, tokens_fed=fed, context_len=args.context,
                              use_cache=not args.no_cache, logits_positions=1)
    peaks = hardware.chip_peaks(args.chip, info.dtype) if args.chip else hardware.measure(args.device, info.dtype)
    bound_s, bound = costs.roofline(cost.total_flops, cost.bound_bytes, peaks)
    knee = costs.decode_knee(info, context_len=args.context, peaks=peaks)
    where = f"{args.chip} (modelled: {peaks.details['source']})" if args.chip else \
        f"this {peaks.device} (measured: {peaks.bound_gbps:.1f} GB/s, {peaks.roofline_flops / 1e9:.1f} GFLOP/s)"
    if args.json:
        _print_json({**cost.to_dict(), "model": info.name, "dtype": info.dtype, "bound_s": bound_s, "bound": bound,
                     "knee_batch": knee, "peaks": peaks.to_dict(), "notes": costs.PART_NOTES})
        return 0
    print(f"{info.name} ({info.dtype}): B={args.batch}, tokens fed {fed}, context {args.context}, "
          f"cache {'off' if args.no_cache else 'on'}, logits for the last position (all figures modelled)")
    print(f"  {'bytes by part':<28} {'MB':>12}")
    for part, value in cost.bytes.items():
        print(f"  {part:<28} {value / 1e6:>12,.3f}  {costs.PART_NOTES.get(part, '')}")
    print(f"  {'total counted (no activations)':<28} {cost.bound_bytes / 1e6:>12,.3f}")
    print(f"  {'FLOPs by part':<28} {'GFLOP':>12}")
    for part, value in cost.flops.items():
        print(f"  {part:<28} {value / 1e9:>12,.3f}")
    print(f"  {'total':<28} {cost.total_flops / 1e9:>12,.3f}")
    print(f"  arithmetic intensity {cost.intensity:,.2f} FLOP/byte")
    print(f"  roofline on {where}: >= {bound_s * 1e3:,.3f} ms ({bound}-bound); decode knee at context "
          f"{args.context}: B={knee if knee is not None else 'none (memory-bound at every batch)'}")
    return 0


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from err


def _add_sweep(sub) -> None:
    p = sub.add_parser("sweep", help="timed sweeps: cache on/off, prefill vs decode, batch size, dtype")
    p.add_argument("kind", choices=["cache", "prefill", "batch", "dtype"])
    p.add_argument("--model", default="bundled:target")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats per point (median reported)")
    p.add_argument("--batches", type=_int_list, default=None, help="batch sizes, e.g. 1,2,4,8 (batch)")
    p.add_argument("--context", type=int, default=None, help="context length (batch, dtype)")
    p.add_argument("--lengths", type=_int_list, default=None, help="prompt lengths, e.g. 16,64,256 (prefill)")
    p.add_argument("--new-tokens", type=int, default=None, help="tokens to generate per mode (cache)")
    p.add_argument("--dtypes", default=None, help="comma-separated, e.g. float32,bfloat16,float16 (dtype)")
    p.add_argument("--csv", default=None, metavar="FILE", help="write the table to FILE (attrs to FILE.attrs.json)")
    p.add_argument("--json", action="store_true", help="print the rows and attrs as JSON")
    p.set_defaults(func=_cmd_sweep)


def _sweep_kwargs(args) -> dict:
    names = {"repeats": "repeats", "batches": "batches", "lengths": "lengths", "new_tokens": "new_tokens"}
    kw = {key: getattr(args, attr) for attr, key in names.items() if getattr(args, attr) is not None}
    if args.context is not None:
        kw["context_len"] = args.context
    if args.dtypes:
        kw["dtypes"] = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    allowed = {"cache": {"repeats", "new_tokens"}, "prefill": {"repeats", "lengths"},
               "batch": {"repeats", "batches", "context_len"}, "dtype": {"repeats", "context_len", "dtypes"}}
    extra = set(kw) - allowed[args.kind]
    if extra:
        raise ValueError(f"`sweep {args.kind}` does not take {', '.join(sorted('--' + k for k in extra))}")
    return kw


def _cmd_sweep(args) -> int:
    import pandas as pd

    from explorer import experiments
    from explorer.loading import load

    kw = _sweep_kwargs(args)
    lm = load(args.model, device=args.device, dtype=args.dtype)
    df = getattr(experiments, args.kind)(lm, **kw)
    if args.csv:
        df.to_csv(args.csv, index=False)
        with open(args.csv + ".attrs.json", "w") as f:
            json.dump(df.attrs, f, indent=2, default=str)
    if args.json:
        _print_json({"rows": json.loads(df.to_json(orient="records")), "attrs": df.attrs})
        return 0
    a = df.attrs
    print(f"sweep {args.kind}: {a['model']} on {a['device']} ({a['dtype']}, {a['threads']} threads), median of "
          f"{a['repeats']} after {a['warmup']} warm-up, {a['timer']}")
    with pd.option_context("display.width", 200, "display.max_columns", 40, "display.float_format", "{:.4g}".format):
        print(df.to_string(index=False))
    if a.get("knee_batch_modelled", "absent") != "absent":
        print(f"roofline knee (modelled): B={a['knee_batch_modelled']}")
    for note in a["notes"]:
        print(f"note: {note}")
    return 0


# --- dispatch ------------------------------------------------------------------------------------

COMMANDS = [_add_info, _add_app, _add_generate, _add_speculate, _add_bench, _add_hardware, _add_cost, _add_sweep]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="explorer", description="See LLM inference step by step.")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from explorer.loading import ModelNotFoundError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except (ModelNotFoundError, ValueError) as err:
        print(f"explorer: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
