"""How often the steadiness verdict (explorer.serving.steady) is wrong, on simulated runs of known
load: its false-alarm rate at 0.8 of capacity and its miss rate at 1.05 x capacity, per run
length.

The load is known because the capacity is measured, not modelled: drain_rate() runs the
simulated engine past saturation (3 x the modelled capacity: it always has work waiting) and
counts the requests it finishes per second over the middle half of the run. Then, for each seed,
a Poisson run at load x that rate is judged; a false alarm is a run at 0.8 judged anything but
stable, a miss a run at 1.05 judged stable.

    python -m explorer.serving.simulate.saturation        # the table (modelled, minutes)
"""

from __future__ import annotations

from dataclasses import dataclass

CALIBRATION = dict(model="arch:smollm2-135m", chip="l4", input_len=256, output_len=16)
LOADS = (0.8, 1.0, 1.05)  # 1.0: how often a run exactly at capacity reads stable
LENGTHS = (2000, 8000)
SEEDS = 10


@dataclass
class SaturationCell:
    """One (load, run length) cell: how many seeded runs got each verdict."""

    load: float
    num_prompts: int
    runs: int
    stable: int
    backlogged: int
    overloaded: int

    @property
    def wrong_pct(self) -> float:
        """False alarms at a load below 1 (runs not judged stable), misses at 1 and above
        (judged stable), in % of the runs."""
        wrong = self.runs - self.stable if self.load < 1 else self.stable
        return 100.0 * wrong / self.runs


def drain_rate(setup, num_prompts: int = 3000, seed: int = 0) -> float:
    """Requests/s the simulated engine finishes when it always has work waiting (a run at 3 x
    the modelled capacity; finishes over the middle half)."""
    res = setup.simulated(3 * setup.capacity, num_prompts, {}, seed=seed)
    ends = sorted(r.end_s for r in res.records if r.end_s is not None)
    mid = ends[len(ends) // 4 : 3 * len(ends) // 4]
    return (len(mid) - 1) / (mid[-1] - mid[0])


def calibrate(
    info, chip: str, input_len: int, output_len: int, *, loads=LOADS, lengths=LENGTHS, seeds=SEEDS
) -> tuple[float, list[SaturationCell]]:
    """(the measured drain rate, one SaturationCell per load and run length); seeds 100, 101, ..."""
    from explorer.serving.simulate.capacity import Setup

    setup = Setup(info, chip, 1, input_len, output_len)
    mu = drain_rate(setup)
    cells = []
    for n in lengths:
        for load in loads:
            got = [
                setup.simulated(load * mu, n, {}, seed=100 + s).result["steadiness"]
                for s in range(seeds)
            ]
            counts = {v: got.count(v) for v in ("stable", "backlogged", "overloaded")}
            cells.append(SaturationCell(load, n, seeds, **counts))
    return mu, cells


def table(mu: float, cells: list[SaturationCell]) -> str:
    lines = [f"measured drain rate {mu:.4g} req/s (modelled)"]
    for c in cells:
        what = "false alarms" if c.load < 1 else "misses"
        lines.append(
            f"  load {c.load:.2f}  {c.num_prompts:>6} requests  {c.runs} seeds: stable "
            f"{c.stable}, backlogged {c.backlogged}, overloaded {c.overloaded}; {what} "
            f"{c.wrong_pct:.0f}%"
        )
    return "\n".join(lines)


def main() -> None:
    from explorer.model.loader import arch_info

    c = CALIBRATION
    info = arch_info(c["model"], "bfloat16")
    print(f"{c['model']} on {c['chip']}, {c['input_len']} in / {c['output_len']} out:")
    print(table(*calibrate(info, c["chip"], c["input_len"], c["output_len"])))


if __name__ == "__main__":
    main()
