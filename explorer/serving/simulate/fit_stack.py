"""Stack families: a chip's realisation under one generation of a serving stack, fitted on the
published serving runs of ONE source, the chip's other sources held out (split by source).

The published MI300X runs disagree by stack, not by chip: vLLM 0.10 on ROCm 6.4 with the AITER
kernels and the V1 engine (S11) lands within 15% of the chip on paper (DEFAULTS), while vLLM 0.6
on ROCm 6.1-6.2 (S13, S14, S15; the V0 engine) ran 2-5x slower than it. So the 2024 stack is
its own family (whatif_settings.STACK_FAMILIES, selected by the chip and the vllm-v0 policy:
vLLM before 0.8), fitted on S15 (dstack: Llama-3.1-405B bf16 on 8x MI300X, bursts of 1 to 2,048
80-token prompts and of 1 to 64 10,000-token prompts), S13 and S14 held out. Each term on the
runs that isolate it, in this order (each a secant search on the median signed log error, as
explorer.serving.simulate.fit's serving stages):

    bw_efficiency          TPOT of the bursts of at most LIGHT_BURST short prompts (a decode step
                           of a handful of requests: the weights' read)
    sequence_overhead_s    output throughput and TPOT of the bursts of at least HEAVY_BURST short
                           prompts (per request in a step: what grows with the batch)
    flop_efficiency        TTFT of the long-prompt bursts (chunked 512-token prefill steps)

then bw_efficiency again at the other two's values. The family's other settings are the
pooled / chip-family ones.
"""

from __future__ import annotations

STACK_SOURCES = {"cdna3-vllm-v0": "S15"}  # the one training source of each stack family
LIGHT_BURST = 4
HEAVY_BURST = 32
LONG_PROMPT = 4096
EVALS = 4  # replays per term (secant)
# each efficiency is searched as its inverse (slowness grows with it), in [1, INVERSE_HIGH]
INVERSE_HIGH = 50.0
SEQUENCE_HIGH = 8e-3  # the most sequence_overhead_s may be (s)


def _prompt(point: dict) -> float:
    wl = point["workload"]
    return wl.get("input_mean") or wl.get("input_len") or 0


def _burst(point: dict) -> int:
    return int(point["workload"].get("num_prompts") or 0)


def stages(points: list[dict]) -> list[tuple[str, list[dict], tuple[str, ...]]]:
    """(term, its runs, its metrics) in fitting order, from a family's training runs."""
    short = [p for p in points if _prompt(p) < LONG_PROMPT]
    light = [p for p in short if _burst(p) <= LIGHT_BURST]
    heavy = [p for p in short if _burst(p) >= HEAVY_BURST]
    long = [p for p in points if _prompt(p) >= LONG_PROMPT]
    bw = ("bw_efficiency", light, ("median_tpot_ms",))
    return [
        bw,
        ("sequence_overhead_s", heavy, ("output_throughput", "median_tpot_ms")),
        ("flop_efficiency", long, ("median_ttft_ms",)),
        bw,
    ]


def fit_stack(points: list[dict], pooled: dict, families: dict, progress=None):
    """({family: fitted values}, [fit.Term]) of every stack family whose source is in `points`."""
    from explorer.serving.simulate.fit_replay import Term

    values: dict[str, dict] = {}
    terms = []
    for family, source in STACK_SOURCES.items():
        train = [p for p in points if p["source"] == source and _family_of(p) == family]
        if not train:
            continue
        mine: dict[str, float] = {}
        for name, runs, metrics in stages(train):
            mine[name] = _search(name, runs, metrics, pooled, families, (family, mine), progress)
        values[family] = mine
        for name, runs, metrics in stages(train)[:3]:
            ids = ", ".join(p["id"] for p in runs) or "none"
            terms.append(Term(name, mine[name], family, f"{source}: {', '.join(metrics)} of {ids}"))
    return values, terms


def _family_of(point: dict) -> str | None:
    from explorer.costs.hardware import chip_named
    from explorer.serving.simulate.engine_map import policy_of
    from explorer.serving.simulate.whatif_settings import stack_family

    return stack_family(chip_named(point["chip"]).name, policy_of(point["engine"]))


def _search(name, runs, metrics, pooled, families, stack, progress) -> float:
    """The value of `name` where the runs' median signed log error on `metrics` is 0 (`stack`:
    the family's name and its values so far)."""
    from explorer.serving.simulate import fit_replay as fit

    efficiency = name.endswith("efficiency")

    def value(x: float) -> float:
        return 1.0 / x if efficiency else x

    def too_slow(x: float) -> float:
        family, mine = stack
        stacks = {family: {**mine, name: value(x)}}
        s = fit.slowness(fit.replay(runs, pooled, families, stacks), metrics)
        if progress:
            progress(f"{name} = {value(x):.4g}: median log(simulated / measured) {s:+.4f}")
        return s

    if efficiency:
        x = fit.secant(too_slow, 1.0, 1.0 / pooled[name], INVERSE_HIGH, EVALS)
        return round(1.0 / max(x, 1.0), 3)
    return round(fit.secant(too_slow, 0.0, SEQUENCE_HIGH / 8, SEQUENCE_HIGH, EVALS), 7)


def report_lines(values: dict) -> list[str]:
    """Each stack family's fitted values against the what-if's STACK_DEFAULTS."""
    from explorer.serving.simulate.whatif_settings import STACK_DEFAULTS, STACK_FAMILIES

    lines = []
    for family, mine in values.items():
        said = STACK_FAMILIES[family][2]
        lines.append(f"stack family {family} (fitted on {STACK_SOURCES[family]}): {said}")
        same = STACK_DEFAULTS.get(family) == mine
        lines.append(
            f"  {mine}: "
            + (
                "the what-if's STACK_DEFAULTS are these"
                if same
                else "put these in whatif_settings.STACK_DEFAULTS"
            )  # fmt: skip
        )
    return lines
