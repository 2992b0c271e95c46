"""Steady state, or say it is not: the trend test on queues whose answer is known, simulated runs
below and above the modelled capacity, the serving sweep stopping past saturation."""

import pytest
from queue_helpers import single_server

from explorer.serving import RequestRecord
from explorer.serving.steady import GROWTH_LIMIT, judge, offered_rate


def test_a_stable_queue_is_steady_and_an_overloaded_one_is_not():
    mu = 100.0  # requests/s the server drains
    stable = judge(single_server(80.0, 1 / mu, 2000), capacity_rps=mu, offered_rps=80.0)
    assert stable["steady"] is True and abs(stable["queue_growth"]) < GROWTH_LIMIT / 5
    assert stable["utilization"] == pytest.approx(0.8)
    over = judge(single_server(130.0, 1 / mu, 2000), capacity_rps=mu, offered_rps=130.0)
    assert over["steady"] is False
    # an overloaded queue keeps 1 - 1/rho of the arrivals (here 0.23, within the Poisson
    # arrivals' own wander over 1,000 requests)
    assert over["queue_growth"] == pytest.approx(1 - 1 / 1.3, abs=0.06)
    assert over["stability"].startswith("unstable: arrivals exceed the modelled capacity of 100")


def test_a_short_overloaded_run_is_caught_too():
    """200 requests at 1.3 x capacity: 2 s of arrivals, the trap the issue fell into."""
    got = judge(single_server(130.0, 0.01, 200, seed=3))
    assert got["steady"] is False and got["utilization"] is None
    assert "unstable" in got["stability"]


def test_requests_at_once_have_no_rate_to_be_steady_at():
    burst = [
        RequestRecord(f"r{i}", 8, 1, 0.0, 0.0, 0.0, [i * 0.01], i * 0.01, 1) for i in range(50)
    ]
    got = judge(burst)
    assert got["steady"] is None and got["queue_growth"] is None
    assert offered_rate(burst) is None
    assert offered_rate(single_server(50.0, 0.001, 3000)) == pytest.approx(50.0, rel=0.05)


def test_simulated_runs_carry_utilization_and_say_unstable():
    from explorer.model.loader import arch_info
    from explorer.serving import Workload
    from explorer.serving.simulate import simulate
    from explorer.serving.simulate.run import saturation_rate
    from explorer.serving.simulate.whatif import chip_model

    info = arch_info("smollm2-135m", "bfloat16")
    model, extra = chip_model(info, "l4")
    mu = saturation_rate(info, model, "continuous", extra["knobs"], 256, 16)
    results = {}
    for u in (0.5, 1.5):
        rate = u * mu
        wl = Workload(600, "poisson", rate, input_len=256, output_len=16, seed=2)
        results[u] = simulate(info, wl, "continuous", model, **extra["knobs"]).result
    low, high = results[0.5], results[1.5]
    assert low["steady"] is True and low["utilization"] == pytest.approx(0.5, rel=0.2)
    assert high["steady"] is False and high["utilization"] > 1
    assert high["stability"].startswith("unstable: arrivals exceed the modelled capacity of")


def test_the_serving_sweep_marks_points_and_stops_past_saturation(target):
    from explorer.sweeps import serving

    df = serving.run(
        target,
        over="rate",
        values=[4000.0, 2000.0, 8000.0],
        num_prompts=24,
        input_len=16,
        output_len=4,
        bar=False,
    )
    # swept from the lowest rate up; 24 requests in ~12 ms cannot be drained: stopped there
    assert list(df["value"]) == [2000.0]
    assert df["steady"].tolist() == [False]
    assert df.attrs["saturated"] == {"continuous": 2000.0}
    assert any("past saturation" in n for n in df.attrs["notes"])
