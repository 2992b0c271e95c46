"""The pays sweep: crossover interpolation, the trick registry as another module uses it, one tiny
real run per kind of row, and bad input as one line. No timing is asserted."""

from __future__ import annotations

import threading

import pytest
import torch

from explorer import sweeps
from explorer.costs.calibrate import Calibration
from explorer.costs.guards import speculative_bound
from explorer.costs.hardware import Peaks
from explorer.costs.speculation import expected_tokens_per_round
from explorer.sweeps import pays
from explorer.sweeps.pays import (
    MEASURED,
    Axis,
    Trick,
    crossings,
    crossover,
    register_trick,
    spec_map,
)

PEAKS = Peaks(device="cpu", dtype="float32", bandwidth_gbps=10.0, flops=1e11, method="modelled")
CAL = Calibration(1e-9, 1e-11, 1e-3, None, models=["any"])  # hand-made: no fit, no timing


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --- crossover -----------------------------------------------------------------------------------


def test_crossover_interpolates_between_the_points_either_side_of_1():
    assert crossover([1, 2, 4], [0.5, 1.5, 2.0]) == pytest.approx(1.5)
    assert crossover([4, 1, 2], [2.0, 0.5, 1.5]) == pytest.approx(1.5)  # axis order, not row order
    assert crossover([1, 8], [2.0, 0.5]) == pytest.approx(1 + 7 * (1 / 1.5))  # falling through 1


def test_no_crossover_in_range_is_none():
    assert crossover([1, 2, 4], [1.2, 1.5, 3.0]) is None
    assert crossover([1, 2, 4], [0.2, 0.5, 0.9]) is None
    assert crossover([1, 2, 3], [1.0, 1.5, 2.0]) is None  # starting at 1 is no crossing
    assert crossover([1, 2, 3], [1.5, 1.0, 1.5]) is None  # touching 1 is no crossing
    assert crossover(["a", "b"], [0.5, 2.0]) is None  # a non-numeric axis (models)
    assert crossover([], []) is None


def test_a_point_exactly_at_1_between_the_sides_is_the_crossing():
    assert crossover([1, 2, 3], [0.5, 1.0, 1.5]) == 2


def test_crossing_twice_reports_the_first_and_lists_both():
    values, speedups = [1, 2, 3, 4], [0.5, 1.5, 1.5, 0.5]
    assert crossings(values, speedups) == pytest.approx([1.5, 3.5])
    assert crossover(values, speedups) == pytest.approx(1.5)


def test_rows_without_a_speedup_are_left_out():
    assert crossover([1, 2, 3], [0.5, None, 1.5]) == pytest.approx(2.0)


# --- the registry, as another module uses it ----------------------------------------------------


@pytest.fixture
def fake_trick():
    """A trick registered from outside the package: fixed figures (speedup = value / 4)."""

    def setup(ctx):
        ctx.attrs["made_by"] = "the test"

        def point(value):
            if value == 3:
                return {"skipped": "3 does not run here", "why": "3 does not run here"}
            ctx.tick()
            return {
                "baseline_s": value / 4,
                "trick_s": 1.0,
                "predicted_speedup": value / 3,
                "regime": "memory",
                "how": MEASURED,
                "why": f"fake {value}",
            }

        return point

    trick = register_trick(
        Trick("fake", "a fake", "nothing", (Axis("n", "ints", (1, 8), "n", high=16),), setup)
    )
    yield trick
    pays.TRICKS.remove("fake")


def test_a_registered_trick_runs_as_the_sweep(target, fake_trick):
    assert "fake" in pays.names()
    df = sweeps.run("pays", target, trick="fake", values=[2, 3, 8], bar=False, peaks=PEAKS)
    assert list(df.columns) == pays.ROW_KEYS
    assert list(df["speedup"][[0, 2]]) == [0.5, 2.0]  # baseline_s / trick_s, computed by the sweep
    assert df["skipped"][1] == "3 does not run here" and df["speedup"].isna()[1]
    assert df.attrs["crossover_measured"] == pytest.approx(4.0)  # 0.5 at 2 -> 2.0 at 8
    assert df.attrs["crossover_predicted"] == pytest.approx(3.0)  # value / 3 reaches 1 at 3
    assert df.attrs["made_by"] == "the test" and df.attrs["axis"] == "n"
    assert not df.attrs["partial"] and not df["partial"].any()


def test_a_stop_keeps_the_rows_measured_and_marks_them_partial(target, fake_trick):
    stop = threading.Event()

    def progress(done, total):
        stop.set()  # after the first point

    df = sweeps.run(
        "pays", target, trick="fake", values=[1, 2, 4], bar=False, stop=stop, progress=progress
    )
    assert list(df["value"]) == [1] and df["partial"].all() and df.attrs["partial"]
    assert any("stopped on request" in n for n in df.attrs["notes"])


# --- real runs, tiny ----------------------------------------------------------------------------


ATTRS = ("model", "device", "dtype", "threads", "repeats", "warmup", "timer", "notes")


def _check_frame(df, trick, axis, values):
    assert list(df.columns) == pays.ROW_KEYS
    assert list(df["trick"]) == [trick] * len(values) and list(df["axis"]) == [axis] * len(values)
    assert list(df["value"]) == values
    for key in (*ATTRS, "crossover_measured", "crossover_predicted", "calibration"):
        assert key in df.attrs
    assert set(df.attrs["columns"]) == set(pays.ROW_KEYS)
    for row in df.to_dict("records"):
        assert row["baseline_s"] > 0 and row["trick_s"] > 0 and row["predicted_speedup"] > 0
        assert row["speedup"] == pytest.approx(row["baseline_s"] / row["trick_s"])
        assert row["regime"] in ("memory", "compute", "overhead") and row["why"]


def test_kv_cache_rows_are_measured(target):
    df = sweeps.run(
        "pays", target, trick="kv-cache", values=[2, 8], repeats=1, warmup=0, bar=False, peaks=PEAKS,
        calibration=CAL,
    )  # fmt: skip
    _check_frame(df, "kv-cache", "length", [2, 8])
    assert set(df["how"]) == {MEASURED}
    assert "8 tokens" in df["why"][1]
    assert df.attrs["spread_pct"] == [0.0, 0.0]  # one repeat per series: no spread to show
    df = sweeps.run(
        "pays", target, trick="kv-cache", values=[4], repeats=3, warmup=0, bar=False, peaks=PEAKS,
        calibration=CAL,
    )  # fmt: skip
    (pct,) = df.attrs["spread_pct"]  # the widest half-range of the row's timed repeats
    assert pct is not None and pct >= 0


def test_speculative_past_batch_1_is_modelled_from_measured_parts(target, draft):
    df = sweeps.run(
        "pays", target, trick="speculative", over="batch", values=[2, 3], repeats=1, warmup=0, bar=False,
        peaks=PEAKS, calibration=CAL, draft=draft, new_tokens=4,
    )  # fmt: skip
    _check_frame(df, "speculative", "batch", [2, 3])
    assert set(df["how"]) == {pays.MODELLED}
    assert 0 <= df.attrs["alpha"][4] <= 1 and df.attrs["draft"] == draft.info.name
    assert "verify pass costs about" in df["why"][0]
    # the parts-model at every batch (the like-for-like line), with the costs it was made from
    assert df.attrs["parts_speedup"] == pytest.approx(dict(zip([2, 3], df["speedup"])))
    assert set(df.attrs["draft_cost"]) == set(df.attrs["verify_cost"]) == {2, 3}
    assert all(c > 0 for c in df.attrs["draft_cost"].values())


# --- speculation's batch x context map (modelled; one cell measured) and the pair check ----------


@pytest.fixture(scope="module")
def h100_pair():
    from explorer.model.loader import arch_info

    t, d = (arch_info(n, "bfloat16") for n in ("llama-3.1-8b", "llama-3.2-1b"))
    return spec_map.on_chip(t, d, "h100")


def test_the_map_on_paper_flips_with_batch_and_the_flip_moves_out_with_context(h100_pair):
    m = spec_map.speedup_map(h100_pair, 0.7, 4, [1, 256], [256, 4096])
    assert [len(row) for row in m.speedup] == [2, 2] and len(m.flips) == 2
    small, large = (spec_map.cell(h100_pair, 0.7, 4, b, 256) for b in (1, 256))
    assert small["speedup"] > 1 > large["speedup"], "pays at batch 1, costs at 256 (short context)"
    assert large["verify_cost"] > 2 * small["verify_cost"], "the verify turns compute-bound"
    assert m.flips[0] is not None and (m.flips[1] is None or m.flips[1] > m.flips[0])
    # the draft's own KV read grows with context (its cost beside the target, c, moves little:
    # the fixed per-step and per-layer overheads weigh on both passes)
    assert h100_pair.draft(1, 1, 4096) > h100_pair.draft(1, 1, 256)
    long = spec_map.cell(h100_pair, 0.7, 4, 1, 4096)
    assert 0 < long["draft_cost"] < 1 and long["draft_cost"] == pytest.approx(
        small["draft_cost"], rel=0.1
    )
    assert m.speedup[1][1] is None, "256 rows of 4096 tokens do not fit beside both models"
    assert m.lines()[0].startswith("context 256: pays below batch") and "rows fits" in m.lines()[0]
    assert m.max_rows[1] < 256 and m.lines()[1].startswith("context 4096: pays at every batch")


def test_a_hand_made_clock_gives_the_parts_formula_and_its_flip():
    setting = spec_map.Setting(
        target=lambda b, fed, past: 1.0 + 0.1 * (fed - 1) * b,  # the verify costs more per row
        draft=lambda b, fed, past: 0.1,
        label="hand-made",
    )
    got = spec_map.cell(setting, 0.5, 2, 1, 10)
    assert got["speedup"] == pytest.approx(expected_tokens_per_round(0.5, 2) / 1.4)
    speedups = [spec_map.cell(setting, 0.5, 2, b, 10)["speedup"] for b in (1, 2, 4)]
    flip = spec_map.flip_batch(setting, 0.5, 2, 10, scan=(1, 2, 4))
    assert 2 < flip < 4 and flip == pytest.approx(crossover([1, 2, 4], speedups))


def test_the_pair_check_refuses_two_vocabularies_in_one_line(target, draft):
    ok, line = spec_map.pair_verdict(target, draft)
    assert ok and "the same tokenizer" in line
    ok, line = spec_map.pair_verdict("arch:llama-3.1-8b", "arch:llama-3.2-1b")
    assert ok and "128,256" in line
    ok, line = spec_map.pair_verdict("arch:llama-3.1-8b", "arch:smollm2-135m")
    assert not ok and "differ in size" in line and "\n" not in line


def test_a_measured_cell_is_the_parts_formula_over_its_own_timings(target, draft):
    got = spec_map.measured_cell(target, draft, 0.5, 2, batch=1, context=8, repeats=1)
    assert got["low"] == pytest.approx(got["speedup"]) == pytest.approx(got["high"])
    assert got["speedup"] == pytest.approx(
        expected_tokens_per_round(0.5, 2) / (got["verify_cost"] + 2 * got["draft_cost"])
    )
    assert got["repeats"] == 1 and got["device"] == str(target.device)
    too_fast = got["verify_cost"] < 1  # a 3-token pass timed faster than a 1-token one
    assert (got["flag"] is not None) == too_fast and (not too_fast or "rerun" in got["flag"])
    assert (got["speedup"] > speculative_bound(0.5, 2, got["draft_cost"])) == too_fast


# --- bad input: one line each -------------------------------------------------------------------


def _arguments(**texts):
    return sweeps.get("pays").arguments(texts, name_of=lambda p: p.cli_flag)


def test_bad_input_names_what_is_allowed(target):
    with pytest.raises(ValueError, match="kv-cache.*speculative"):
        _arguments(trick="nope")
    with pytest.raises(ValueError, match="trick kv-cache sweeps length; got 'batch'"):
        _arguments(trick="kv-cache", over="batch")
    with pytest.raises(ValueError, match=">= 2"):
        _arguments(trick="kv-cache", values="1,8")
    with pytest.raises(ValueError, match="a whole number >= 1 and <= 32, got 'two'"):
        _arguments(trick="speculative", over="k", values="1,two")
    with pytest.raises(ValueError, match="<= 1"):
        _arguments(trick="prefix-cache", over="hit", values="0.5,2")
    assert _arguments(trick="int8", over="prefill", values="1,64")["values"] == ["1", "64"]
    too_long = str(target.info.max_positions + 1)
    with pytest.raises(ValueError, match=f"{too_long} exceed"):
        sweeps.run("pays", target, trick="kv-cache", values=[2, int(too_long)], bar=False)


def test_the_cli_says_one_line(capsys):
    from explorer.cli import main

    assert main(["sweep", "pays", "--trick", "compile", "--over", "length"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "sweeps model, batch" in err


def test_default_values_beyond_the_model_are_left_out_with_a_note(target):
    axis = pays.get_trick("int8").axis("prefill")
    notes = []
    kept = axis.fitting(list(axis.default), target.info, notes)
    limit = target.info.max_positions - 16
    assert kept == [v for v in axis.default if v <= limit]
    assert len(kept) < len(axis.default) and f"allows {limit}" in notes[0]


def test_weights_this_device_cannot_run_give_rows_that_say_why(target, monkeypatch):
    from explorer.model.quant import WeightsNotSupportedError
    from explorer.sweeps.pays import weights

    def refuse(lm, kind):
        raise WeightsNotSupportedError(f"{kind} matmuls do not run on this test device")

    monkeypatch.setattr(weights, "with_weights", refuse)
    df = sweeps.run("pays", target, trick="fp16", values=[1, 16], bar=False, peaks=PEAKS)
    assert list(df["value"]) == [1, 16] and df["speedup"].isna().all()
    assert all("fp16 does not run here: fp16 matmuls do not run" in s for s in df["skipped"])
    assert df.attrs["crossover_measured"] is None and not df.attrs["partial"]
