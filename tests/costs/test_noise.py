"""The one estimator and the interference bookkeeping, on synthetic timings (fake clocks)."""

from __future__ import annotations

import pytest

from explorer.costs import noise
from explorer.costs.timing import Measurement, alternate, measure


class FakeMachine:
    """A wall clock and a CPU clock that the test moves: each call `work(wall, cpu)` advances both,
    as a region that took `wall` seconds of which the process ran `cpu` seconds would."""

    def __init__(self, plan, load=0.5, cpu_readable=True):
        self.plan = list(plan)  # (wall, cpu) per timed call, in order
        self.wall_t = self.cpu_t = 0.0
        self._load, self.cpu_readable = load, cpu_readable

    def clocks(self) -> noise.Clocks:
        return noise.Clocks(
            wall=lambda: self.wall_t,
            cpu=lambda: self.cpu_t if self.cpu_readable else None,
            load=lambda: self._load,
        )

    def work(self):
        wall, cpu = self.plan.pop(0)
        self.wall_t += wall
        self.cpu_t += cpu


def test_low_quantile_is_the_nearest_rank():
    samples = [5.0, 1.0, 4.0, 2.0, 3.0, 9.0, 8.0, 7.0]
    assert noise.low_quantile(samples, 0.0) == 1.0
    assert noise.low_quantile(samples, 0.25) == 2.0  # ceil(0.25 x 8) = 2nd smallest
    assert noise.low_quantile(samples, 0.5) == 4.0
    assert noise.low_quantile([3.0, 1.0, 2.0], 0.25) == 1.0


def test_the_default_quantile_is_p25_from_four_repeats_else_the_minimum():
    assert noise.min_repeats(0.25) == 4
    assert noise.min_repeats(0.1) == 10
    assert noise.min_repeats(0.0) == 1
    assert noise.quantile_for(4) == 0.25
    assert noise.quantile_for(3) == 0.0
    assert Measurement([3.0, 1.0, 2.0]).quantile == 0.0
    assert Measurement([4.0, 3.0, 1.0, 2.0]).estimate == 1.0


def test_too_few_repeats_for_the_stated_quantile_names_the_minimum():
    with pytest.raises(noise.TooFewRepeats, match="needs at least 10 repeats, got 5"):
        noise.check_repeats(5, 0.1)
    with pytest.raises(noise.TooFewRepeats, match="at least 4 repeats, got 3"):
        measure(lambda: None, "cpu", repeats=3, warmup=0, quantile=0.25)
    with pytest.raises(ValueError, match=r"quantile must be in \[0, 1\)"):
        noise.min_repeats(1.5)
    noise.check_repeats(1, 0.0)  # the minimum needs one repeat


def test_spread_is_the_median_above_the_estimate():
    m = Measurement([1.0, 1.2, 1.5, 2.0, 1.1])  # p25 of 5 = 2nd smallest = 1.1, median 1.2
    assert m.estimate == 1.1
    assert m.spread == pytest.approx((1.2 - 1.1) / 1.1)
    assert Measurement([2.0]).spread == 0.0


def test_a_quiet_region_is_not_noisy():
    machine = FakeMachine([(0.010, 0.010)] * 5)
    m = measure(machine.work, "cpu", repeats=5, warmup=0, threads=1, clocks=machine.clocks())
    assert m.samples == pytest.approx([0.010] * 5)
    assert m.cpu_share == pytest.approx(1.0)
    assert not m.noisy and m.reason == ""
    assert m.load == 0.5


def test_other_work_taking_the_cpu_marks_the_figure_noisy_with_its_share():
    # each call took 10 ms of wall time but the process ran for only 6 ms of it
    machine = FakeMachine([(0.010, 0.006)] * 5)
    m = measure(machine.work, "cpu", repeats=5, warmup=0, threads=1, clocks=machine.clocks())
    assert m.cpu_share == pytest.approx(0.6)
    assert m.noisy
    assert m.reason == "other work took 40% of this CPU during this measurement"
    d = m.to_dict()
    assert d["noisy"] is True and d["cpu_share"] == pytest.approx(0.6)
    assert "NOISY: other work took 40%" in noise.describe(d)


def test_the_cpu_share_counts_the_threads_the_process_could_use():
    machine = FakeMachine([(0.010, 0.018)] * 4)  # two threads, 90% busy between them
    m = measure(machine.work, "cpu", repeats=4, warmup=0, threads=2, clocks=machine.clocks())
    expected = 0.9 if noise.usable_cores() >= 2 else 1.0  # threads capped at the usable cores
    assert m.usage.threads == min(2, noise.usable_cores())
    assert m.cpu_share == pytest.approx(expected)
    assert not m.noisy


def test_a_wide_spread_marks_the_figure_noisy_even_with_the_cpu_to_itself():
    plan = [(w, w) for w in (0.010, 0.010, 0.020, 0.020, 0.030)]
    machine = FakeMachine(plan)
    m = measure(machine.work, "cpu", repeats=5, warmup=0, threads=1, clocks=machine.clocks())
    assert m.estimate == pytest.approx(0.010) and m.spread == pytest.approx(1.0)
    assert m.noisy and m.reason == "its repeats spread 100% above the estimate"


def test_without_cpu_times_the_spread_alone_decides_and_says_so():
    machine = FakeMachine([(0.010, 0.0)] * 4, cpu_readable=False)
    m = measure(machine.work, "cpu", repeats=4, warmup=0, threads=1, clocks=machine.clocks())
    assert m.cpu_share is None and not m.cpu_readable
    assert not m.noisy
    assert m.reason == noise.NO_CPU_TIMES
    machine = FakeMachine([(0.01, 0.0), (0.01, 0.0), (0.03, 0.0), (0.03, 0.0)], cpu_readable=False)
    m = measure(machine.work, "cpu", repeats=4, warmup=0, threads=1, clocks=machine.clocks())
    assert m.noisy and m.reason.endswith(noise.NO_CPU_TIMES)


def test_alternate_interleaves_the_arms_and_keeps_each_arms_interference():
    order = []
    machine = FakeMachine([])

    def arm(name, wall, cpu):
        def run():
            order.append(name)
            machine.plan.append((wall, cpu))
            machine.work()
            return name

        return run

    got = alternate(
        {"a": arm("a", 0.01, 0.01), "b": arm("b", 0.02, 0.01)},
        4,
        warmup=1,
        keep=True,
        threads=1,
        clocks=machine.clocks(),
    )
    assert order == ["a", "b", "a", "b", "b", "a", "a", "b", "b", "a"]  # warm-up, then ABBA
    assert got["a"].samples == pytest.approx([0.01] * 4) and got["a"].results == ["a"] * 4
    assert got["b"].cpu_share == pytest.approx(0.5) and got["b"].noisy
    assert not got["a"].noisy


def test_own_figure_reports_what_the_arm_returns_and_still_watches_the_cpu():
    machine = FakeMachine([(0.5, 0.1)] * 4)

    def run():
        machine.work()
        return 0.002  # e.g. seconds per token, measured inside the run

    m = alternate({"x": run}, 4, own_figure=True, threads=1, clocks=machine.clocks())["x"]
    assert m.samples == [0.002] * 4
    assert m.cpu_share == pytest.approx(0.2) and m.noisy


def test_after_runs_untimed_after_every_call():
    machine, seen = FakeMachine([(0.01, 0.01)] * 3), []

    def after():
        seen.append(machine.wall_t)
        machine.wall_t += 1.0  # outside the timed region: must not count

    m = measure(
        machine.work, "cpu", repeats=2, warmup=1, after=after, threads=1, clocks=machine.clocks()
    )
    assert len(seen) == 3
    assert m.samples == pytest.approx([0.01, 0.01])


def test_a_step_slowed_by_other_work_gets_a_badge_on_the_strip():
    from explorer import plots
    from explorer.engine.trace import Step
    from explorer.plots.common import NOISY_COLOR

    def step(i, share):
        return Step(
            index=i, phase="decode", tokens_fed=1, context_len=4 + i, token_id=5, token_text="a",
            cpu_share=share,
        )  # fmt: skip

    cols = plots.strip_columns([step(1, 0.95), step(2, 0.4), step(3, None)])["tokens"]
    assert list(cols["marker.line.color"]) == ["#fff", NOISY_COLOR, "#fff"]
    assert "other work took 60% of this CPU" in cols["hovertext"][1]
    assert "noisy" not in cols["hovertext"][0] and "noisy" not in cols["hovertext"][2]
    assert noise.busy_reason(0.8) is None and noise.busy_reason(None) is None


def test_a_sweep_says_which_rows_are_noisy_in_one_line_each(capsys):
    import pandas as pd

    from explorer.cli.sweep import print_noisy

    df = pd.DataFrame(
        [
            {"batch": 1, "noisy": False, "noisy_reason": ""},
            {"batch": 4, "noisy": True, "noisy_reason": "other work took 40% of this CPU"},
        ]
    )
    print_noisy(df)
    assert capsys.readouterr().out == "noisy: row 1: other work took 40% of this CPU\n"
    print_noisy(df.drop(columns=["noisy"]))
    assert capsys.readouterr().out == ""


def test_a_sweep_chart_rings_its_noisy_points():
    import pandas as pd

    from explorer.plots.common import NOISY_COLOR
    from explorer.plots.sweeps import _marks

    df = pd.DataFrame({"noisy": [False, True, None]})
    marks = _marks(df)
    assert list(marks["marker.line.width"]) == [0.0, 2.0, 0.0]
    assert marks["marker.line.color"][1] == NOISY_COLOR
    assert _marks(pd.DataFrame({"batch": [1]})) == {}


def test_bench_overhead_refuses_a_quantile_its_repeats_cannot_estimate(capsys):
    from explorer.cli import main

    assert main(["bench", "overhead", "--repeats", "5", "--quantile", "0.1"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "explorer: a 0.1 quantile needs at least 10 repeats, got 5; ask for --repeats 10 or more, "
        "or quantile 0 (the minimum)\n"
    )


def test_a_frame_says_how_many_of_its_points_are_noisy():
    reason = "other work took 40% of this CPU during this measurement"
    assert noise.noisy_summary([False, True, None], ["", reason, ""]) == (
        f"1 of 3 points noisy ({reason})"
    )
    assert noise.noisy_summary([False, False], ["", ""]) == ""
    assert noise.noisy_summary(None, None) == ""
