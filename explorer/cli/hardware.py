"""explorer hardware / cost: measured peaks of this machine, modelled costs of one forward pass."""

from __future__ import annotations

from explorer.cli.common import cost_info, print_json
from explorer.costs.kvdtype import KV_DTYPE_HELP, KV_DTYPES

ORDER = 50


def add(sub) -> None:
    _add_hardware(sub)
    _add_cost(sub)


def _add_hardware(sub) -> None:
    p = sub.add_parser(
        "hardware", help="measured peaks of this machine (bandwidth, matmul FLOP/s) + known chips"
    )
    p.add_argument("--device", default="auto")
    p.add_argument(
        "--dtype", default="auto", help="dtype of the matmul peak (auto: float32 on CPU)"
    )
    p.add_argument(
        "--thorough", action="store_true", help="larger buffers and more repeats (slower)"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_hardware)


def _cmd_hardware(args) -> int:
    from dataclasses import asdict

    from explorer.costs import hardware
    from explorer.model.loader import resolve_device, resolve_dtype

    dev = resolve_device(args.device)
    peaks = hardware.measure(dev, resolve_dtype(args.dtype, dev), thorough=args.thorough)
    if args.json:
        print_json(
            {
                "measured": peaks.to_dict(),
                "known_chips_modelled": [asdict(c) for c in hardware.KNOWN_CHIPS.values()],
            }
        )
        return 0
    d = peaks.details
    print(
        f"measured on {peaks.device} ({peaks.dtype}, {d['threads']} threads, median of {d['bandwidth_repeats']} "
        f"(bandwidth) / {d['repeats']} (matmul) after {d['warmup']} warm-up, {d['timer']}, "
        f"load average {d['load_average']}):"
    )
    print(
        f"  copy        {peaks.copy_gbps:8.1f} GB/s   ({d['buffer_bytes'] >> 20} MiB copy, read + write counted)"
    )
    print(
        f"  read        {peaks.read_gbps:8.1f} GB/s   ({d['buffer_bytes'] >> 20} MiB matrix-vector product)"
    )
    if peaks.cache_gbps:
        print(
            f"  cache       {peaks.cache_gbps:8.1f} GB/s   (best, buffer 1/4 of the {peaks.cache_bytes >> 20} MiB "
            "last-level cache)"
        )
    print(f"  matmul      {peaks.flops / 1e9:8.1f} GFLOP/s ({d['matmul_n']}^3 {peaks.dtype})")
    print(
        f"  roofline    {peaks.bound_gbps:8.1f} GB/s, {peaks.roofline_flops / 1e9:.1f} GFLOP/s (best repeats)"
    )
    print("\nknown chips (vendor figures; modelled wherever used):")
    print(f"  {'chip':<14} {'GB/s':>7} {'bf16 TFLOP/s':>13} {'fp32 TFLOP/s':>13}  source")
    for c in hardware.KNOWN_CHIPS.values():
        bf16 = "-" if c.bf16_tflops is None else f"{c.bf16_tflops:g}"
        print(f"  {c.name:<14} {c.bandwidth_gbps:>7g} {bf16:>13} {c.fp32_tflops:>13g}  {c.source}")
    return 0


def _add_cost(sub) -> None:
    p = sub.add_parser(
        "cost", help="modelled FLOPs and bytes of one forward pass, by part, and its roofline"
    )
    p.add_argument(
        "--model",
        default="bundled:target",
        help="bundled:target (default), arch:NAME, hub id or path",
    )
    p.add_argument("--batch", type=int, default=1)
    p.add_argument(
        "--context", type=int, default=128, help="context length L (cached prefix + fed tokens)"
    )
    p.add_argument(
        "--tokens-fed",
        type=int,
        default=1,
        help="tokens fed per row (1 = a decode step; L = prefill)",
    )
    p.add_argument("--no-cache", action="store_true", help="no KV cache: the whole context is fed")
    p.add_argument(
        "--chip", default=None, help="model the bound on a known chip (see `explorer hardware`)"
    )
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--kv-dtype", default=None, choices=KV_DTYPES, help=KV_DTYPE_HELP)
    p.add_argument("--json", action="store_true")
    p.add_argument("--ops", action="store_true", help="operator by operator (explorer.cli.ops)")
    p.add_argument("--tp", type=int, default=1, help="--ops with --chip: tensor-parallel GPUs")
    p.add_argument("--html", default=None, metavar="FILE", help="--ops: the picture as HTML")
    p.add_argument(
        "--png", default=None, metavar="FILE", help="--ops: the picture as PNG (chromium draws it)"
    )
    p.set_defaults(func=_cmd_cost)


def _cmd_cost(args) -> int:
    from explorer import costs
    from explorer.costs import hardware

    if args.ops or args.html or args.png or args.tp != 1:
        from explorer.cli.ops import run_ops

        return run_ops(args)
    info = cost_info(args.model, args.device, args.dtype)
    fed = args.context if args.no_cache else args.tokens_fed
    cost = costs.forward_cost(
        info,
        batch=args.batch,
        tokens_fed=fed,
        context_len=args.context,
        use_cache=not args.no_cache,
        logits_positions=1,
        kv_dtype=args.kv_dtype,
    )
    peaks = (
        hardware.chip_peaks(args.chip, info.dtype)
        if args.chip
        else hardware.measure(args.device, info.dtype)
    )
    bound_s, bound = costs.roofline(cost.total_flops, cost.bound_bytes, peaks)
    knee = costs.decode_knee(info, context_len=args.context, peaks=peaks)
    where = (
        f"{args.chip} (modelled: {peaks.details['source']})"
        if args.chip
        else f"this {peaks.device} (measured: {peaks.bound_gbps:.1f} GB/s, {peaks.roofline_flops / 1e9:.1f} GFLOP/s)"
    )
    if args.json:
        print_json(
            {
                **cost.to_dict(),
                "model": info.name,
                "dtype": info.dtype,
                "bound_s": bound_s,
                "bound": bound,
                "knee_batch": knee,
                "peaks": peaks.to_dict(),
                "notes": costs.PART_NOTES,
            }
        )
        return 0
    _print_cost(args, info, cost, fed, where, bound_s, bound, knee)
    return 0


def _print_cost(args, info, cost, fed, where, bound_s, bound, knee) -> None:
    """The cost by part as a table, the roofline and the decode knee (all modelled)."""
    from explorer import costs

    print(
        f"{info.name} ({info.dtype}): B={args.batch}, tokens fed {fed}, context {args.context}, "
        f"cache {'off' if args.no_cache else 'on'}, logits for the last position (all figures modelled)"
    )
    print(f"  {'bytes by part':<28} {'MB':>12}")
    for part, value in cost.bytes.items():
        print(f"  {part:<28} {value / 1e6:>12,.3f}  {costs.PART_NOTES.get(part, '')}")
    print(f"  {'total counted (no activations)':<28} {cost.bound_bytes / 1e6:>12,.3f}")
    print(f"  {'FLOPs by part':<28} {'GFLOP':>12}")
    for part, value in cost.flops.items():
        print(f"  {part:<28} {value / 1e9:>12,.3f}")
    print(f"  {'total':<28} {cost.total_flops / 1e9:>12,.3f}")
    print(f"  arithmetic intensity {cost.intensity:,.2f} FLOP/byte")
    print(
        f"  roofline on {where}: >= {bound_s * 1e3:,.3f} ms ({bound}-bound); decode knee at context "
        f"{args.context}: B={knee if knee is not None else 'none (memory-bound at every batch)'}"
    )
