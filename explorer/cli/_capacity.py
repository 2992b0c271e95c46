"""What `explorer simulate --capacity` takes: every flag it is given is used or refused, in one line.

The capacity search (explorer.serving.simulate.capacity) runs its own Poisson workloads at the
rates it probes, from --input-len and --output-len, starting at max(--num-prompts, 200)
requests: the flags that shape a single run's arrivals or replay a file change nothing there, so
they are refused rather than silently dropped. Lengths go through the Workload's own checks and
the model's context, as plain `simulate` does.
"""

from __future__ import annotations

# flags of plain `simulate` that the capacity search does not use, with their parser defaults
UNUSED = {
    "workload": ("--workload", None),
    "request_rate": ("--request-rate", None),
    "burstiness": ("--burstiness", 1.0),
    "arrival": ("--arrival", None),
    "max_concurrency": ("--max-concurrency", None),
    "seed": ("--seed", 0),
    "no_ignore_eos": ("--no-ignore-eos", False),
    "measured": ("--measured", None),
    "refit": ("--refit", False),
}
WHY = (
    "the capacity search runs its own Poisson workloads of --input-len / --output-len tokens at "
    "the rates it probes"
)


MIN_CHECK = 500  # requests per seed below which a check run says little about a p99


def check_capacity_flags(args) -> None:
    """ValueError naming the first flag --capacity would ignore, or a --num-prompts past its bound."""
    from explorer.serving.simulate.capacity import MAX_PROMPTS
    from explorer.serving.simulate.policy import knob_table, modelled

    for dest, (flag, default) in UNUSED.items():
        if getattr(args, dest, default) != default:
            raise ValueError(f"--capacity does not use {flag}: {WHY}; drop {flag}")
    for knob, (spec, _, _) in knob_table(modelled()).items():
        if getattr(args, knob, None) is not None:
            flag = spec.cli or "--" + knob.replace("_", "-")
            raise ValueError(
                f"--capacity does not use {flag}: the search runs --engine's scheduler with the "
                "knobs the chip's memory plan sets; drop it"
            )
    check = getattr(args, "check_prompts", None)
    if check is not None and not MIN_CHECK <= check <= MAX_PROMPTS:
        raise ValueError(
            f"--check-prompts must be a whole number from {MIN_CHECK:,} to {MAX_PROMPTS:,} (a "
            f"shorter run cannot tell a p99 at capacity from noise), got {check}"
        )
    n = args.num_prompts
    if not isinstance(n, int) or not 1 <= n <= MAX_PROMPTS:
        raise ValueError(
            f"--num-prompts with --capacity must be a whole number from 1 to {MAX_PROMPTS:,} (the "
            f"longest run the search makes), got {n!r}"
        )


def check_capacity_lengths(args, info) -> None:
    """--input-len and --output-len through the Workload's checks, then the model's context."""
    from explorer.serving import Workload
    from explorer.serving.engines import check_context

    one = Workload(num_prompts=1, input_len=args.input_len, output_len=args.output_len)
    (request,) = one.requests(vocab_size=info.vocab_size)
    try:
        check_context(info, [request])
    except ValueError:
        raise ValueError(
            f"--input-len {args.input_len} + --output-len {args.output_len} is more than "
            f"{info.name}'s context of {info.max_positions} positions"
        ) from None
