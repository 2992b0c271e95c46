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


# --- explorer generate ---------------------------------------------------------------------------


def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help="generate step by step, one forward pass per token, every step recorded")
    p.add_argument("--model", default=None, help="bundled:target (default), bundled:draft, arch:NAME, hub id or path")
    p.add_argument("--prompt", default=None, help="the prompt text ('' starts from BOS)")
    p.add_argument("--prompt-ids", default=None, metavar="IDS",
                   help="comma-separated token ids instead of --prompt (for models without a tokenizer)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=1.0, help="0 means greedy")
    p.add_argument("--top-k", type=int, default=0, help="0 = off (generate() would silently use 50)")
    p.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    p.add_argument("--min-p", type=float, default=0.0, help="0 = off")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="1 = off")
    p.add_argument("--greedy", action="store_true", help="argmax instead of sampling")
    p.add_argument("--seed", type=int, default=None)
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
    p.add_argument("--json", action="store_true")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.set_defaults(func=_cmd_bench_overhead)


def _cmd_bench_overhead(args) -> int:
    from explorer.engine import overhead_benchmark
    from explorer.loading import load

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


BENCH_COMMANDS = [_add_bench_overhead]


# --- dispatch ------------------------------------------------------------------------------------

COMMANDS = [_add_info, _add_generate, _add_bench]


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
