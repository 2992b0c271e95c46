"""Calibration (explorer.costs.calibrate), the regime map it is measured on, and the trust table."""

from __future__ import annotations

import json

import pytest

from explorer import sweeps
from explorer.costs import calibrate
from explorer.costs.trust import trust
from explorer.engine.sampling import Sampling
from explorer.engine.session import Session
from explorer.sweeps.regime_map import points

REAL_CHECK_QUIET = calibrate.check_quiet


@pytest.fixture(autouse=True)
def _any_load(monkeypatch):
    """These tests check the fit, not this shared machine's load: the busy check is tested on
    synthetic cells below (REAL_CHECK_QUIET)."""
    monkeypatch.setattr(calibrate, "check_quiet", lambda cells: None)


def _synthetic(model, layers, a, b, c, d, cells):
    return [
        {
            "model": model,
            "layers": layers,
            "batch": B,
            "context_len": L,
            "bytes": 1e6 * B + 1e4 * B * L,
            "flops": 1e7 * B,
            "latency_s": a * (1e6 * B + 1e4 * B * L) + b * 1e7 * B + c + d * layers,
            "bound_s": 1e-9 * (1e6 * B + 1e4 * B * L),
        }
        for B, L in cells
    ]


def test_fit_recovers_known_parameters_and_scores_held_out_points():
    cells = [(B, L) for B in (1, 4, 16) for L in (64, 256, 512)]
    pts = _synthetic("a", 4, 2e-10, 5e-11, 1e-3, 2e-4, cells) + _synthetic(
        "b", 24, 2e-10, 5e-11, 1e-3, 2e-4, cells
    )
    train, heldout = calibrate.split_points(pts)
    assert len(train) == 8 and len(heldout) == 10  # per model: 3 at the smallest context + 1
    assert {p["context_len"] for p in heldout} == {256, 512}
    cal = calibrate.fit(train, heldout)
    assert cal.s_per_byte == pytest.approx(2e-10, rel=1e-6)
    assert cal.s_per_flop == pytest.approx(5e-11, rel=1e-6)
    assert cal.step_overhead_s == pytest.approx(1e-3, rel=1e-6)
    assert cal.layer_overhead_s == pytest.approx(2e-4, rel=1e-6)
    assert cal.heldout_err_after_pct == pytest.approx(0, abs=1e-6)
    assert cal.heldout_err_before_pct > 50  # the bound is a floor, far below these latencies
    assert set(cal.per_model) == {"a", "b"}
    again = calibrate.Calibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert again.predict_point(pts[5]) == pytest.approx(pts[5]["latency_s"])


def test_too_few_points_says_how_many_it_needs():
    pts = _synthetic("a", 4, 1e-10, 0, 1e-3, 0, [(1, 64), (2, 64)])
    with pytest.raises(calibrate.TooFewPoints, match="at least 3 measured steps"):
        calibrate.fit(pts)
    two = pts + _synthetic("b", 8, 1e-10, 0, 1e-3, 0, [(1, 64)])
    with pytest.raises(calibrate.TooFewPoints, match="at least 4 measured steps"):
        calibrate.fit(two)
    with pytest.raises(ValueError, match="lacks"):
        calibrate.fit([{"model": "a"}] * 5)


def test_regime_map_measures_a_grid_and_calibrates_the_bundled_model(target):
    df = sweeps.run(
        "regime-map", target, batches=[1, 4], contexts=[32, 64, 9999], repeats=2, bar=False
    )
    assert len(df) == 4 and set(df.batch) == {1, 4}
    assert any("9999" in n for n in df.attrs["notes"])  # beyond 512 positions: dropped, said
    assert (df.latency_s_measured > 0).all()
    assert set(df.regime_derived) <= {"memory", "compute", "overhead"}
    assert df.attrs["overhead_floor_s"] > 0 and df.attrs["kv_equals_weights_tokens"] > 0
    assert (df.kv_over_weights_modelled > 0).all()
    from explorer import plots

    fig = plots.sweep("regime-map", df)
    cells = {
        r: len(next(t for t in fig.data if t.name == f"{r}-bound (measured)").x)
        for r in ("memory", "compute", "overhead")
    }
    assert cells == {r: int((df.regime_derived == r).sum()) for r in cells}
    kv = next(t for t in fig.data if t.name == "KV bytes = weight bytes (modelled)")
    eq = df.attrs["kv_equals_weights_tokens"]
    assert 16 * 4 < eq / 31 and eq / 63 < 16 * 4  # bundled: ~3760 tokens, so B = 121 and 60
    assert list(kv.x) == [32, 64] and kv.y[0] != kv.y[0] and kv.y[1] == pytest.approx(eq / 63)
    assert "overhead floor" in fig.layout.title.text
    pts = points(df)
    cal = calibrate.fit(pts[:3], pts[3:])
    assert cal.heldout_err_after_pct is not None and cal.n_heldout == 1
    calibrate.use(cal)
    try:
        again = sweeps.run("regime-map", target, batches=[2], contexts=[48], repeats=1, bar=False)
        assert again.latency_s_calibrated.notna().all()
        assert again.attrs["calibration"]["models"] == ["bundled:target"]
        batch = sweeps.run("batch", target, batches=[1, 2], repeats=1, bar=False)
        cal_again = calibrate.Calibration.from_dict(batch.attrs["calibration"])
        row = batch.iloc[1]
        assert row.latency_s_calibrated == pytest.approx(
            cal_again.predict(
                bytes=row.bytes_modelled, flops=row.flops_modelled, layers=target.info.layers
            )
        )
        from explorer import plots

        line = next(t for t in plots.sweep("batch", batch).data if t.name.startswith("calibrated"))
        assert list(line.y) == pytest.approx(list(batch.latency_s_calibrated * 1e3))
        s = Session(target, "The return", Sampling(greedy=True), max_new_tokens=3)
        s.run()
        assert s.trace.calibration is not None  # saved with the trace
        table = trust(s.trace)
    finally:
        calibrate.use(None)
    kinds = {r["prediction"] for r in table}
    assert kinds == {"step latency = roofline bound", "step latency, calibrated"}
    bound = [r for r in table if r["prediction"] == "step latency = roofline bound"]
    assert all(r["err_pct"] < 0 for r in bound)  # a floor: always below the measured latency
    assert sum(r["n"] for r in bound) == len(s.trace.steps)


def test_trust_of_speculative_rows_and_a_batch_knee():
    import pandas as pd

    df = pd.DataFrame({"batch": [1]})
    df.attrs.update(knee_batch_modelled=40, knee_batch_measured=32, context_len=128)
    rows = trust(None, speculative=[{"k": 2, "predicted": 1.5, "measured": 1.2}], batch=df)
    spec, knee = rows
    assert spec["err_pct"] == pytest.approx(25.0) and spec["group"] == "k=2"
    assert knee["err_pct"] == pytest.approx(25.0) and knee["unit"] == "batch"


def test_cli_bench_calibrate_json(tmp_path, capsys):
    from explorer.cli import main

    out = tmp_path / "cal.json"
    args = ["bench", "calibrate", "--model", "bundled:target", "--batches", "1,2"]
    assert main([*args, "--contexts", "32,64", "--repeats", "1", "--json", "--out", str(out)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["heldout_err_before_pct"] is not None and d["heldout_err_after_pct"] is not None
    assert calibrate.Calibration.load(out).models == ["bundled:target"]
    assert (
        main(
            [
                "bench",
                "calibrate",
                "--model",
                "bundled:target",
                "--contexts",
                "32,64",
                "--batches",
                "1",
            ]
        )
        == 2
    )
    assert "at least 3 measured steps" in capsys.readouterr().err


def test_a_machine_too_busy_to_fit_is_refused_in_one_line():
    quiet = [{"cpu_share": 0.95, "spread": 0.02}] * 5
    REAL_CHECK_QUIET(quiet)  # no error
    busy = [{"cpu_share": 0.55, "spread": 0.02}] * 4 + [{"cpu_share": 1.0, "spread": 0.0}]
    with pytest.raises(calibrate.MachineTooBusy, match=r"other work took 45% of this CPU .*median"):
        REAL_CHECK_QUIET(busy)
    assert calibrate.too_busy(busy).startswith("the machine is too busy to fit")
    assert calibrate.too_busy(quiet) is None
    no_cpu_times = [{"cpu_share": None, "spread": 0.4}] * 3
    with pytest.raises(calibrate.MachineTooBusy, match="spread 40%.*cannot be read"):
        REAL_CHECK_QUIET(no_cpu_times)
    REAL_CHECK_QUIET([{"cpu_share": None, "spread": 0.05}] * 3)


def test_cli_bench_calibrate_on_a_busy_machine_keeps_the_last_good_fit(
    tmp_path, capsys, monkeypatch
):
    from explorer.cli import bench, main

    out = tmp_path / "cal.json"
    out.write_text('{"the": "last good fit"}')

    def too_busy(*a, **kw):
        REAL_CHECK_QUIET([{"cpu_share": 0.5, "spread": 0.1}] * 6)

    monkeypatch.setattr(bench, "calibrate_models", too_busy)
    args = ["bench", "calibrate", "--model", "bundled:target", "--out", str(out)]
    assert main(args) == bench.EXIT_TOO_BUSY != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "too busy to fit" in err and "50%" in err
    assert f"{out} keeps the last good fit" in err
    assert out.read_text() == '{"the": "last good fit"}'


def _grid_frame(cpu_share: float):
    import pandas as pd

    pts = _synthetic(
        "m", 4, 2e-9, 1e-10, 1e-3, 0.0, [(B, L) for B in (1, 2, 4) for L in (8, 16, 32)]
    )
    df = pd.DataFrame(
        {
            "batch": p["batch"],
            "context_len": p["context_len"],
            "latency_s_measured": p["latency_s"],
            "bytes_modelled": p["bytes"],
            "flops_modelled": p["flops"],
            "bound_s_modelled": p["bound_s"],
            "cpu_share_measured": cpu_share,
            "spread_measured": 0.01,
            "noisy": cpu_share < 0.75,
        }
        for p in pts
    )
    df.attrs.update(model="m", device="cpu", dtype="float32", layers=4, threads=1)
    return df


def test_a_busy_grid_is_refused_when_asked_and_noted_otherwise(monkeypatch):
    from explorer.sweeps.regime_map import calibration_from

    monkeypatch.setattr(calibrate, "check_quiet", REAL_CHECK_QUIET)
    quiet = calibration_from([_grid_frame(0.97)], refuse_busy=True)
    assert quiet.interference["median_cpu_share"] == pytest.approx(0.97)
    assert quiet.interference["noisy_cells"] == 0 and quiet.interference["cells"] == 9
    assert not any("too busy" in n for n in quiet.notes)
    with pytest.raises(calibrate.MachineTooBusy, match="other work took 40%"):
        calibration_from([_grid_frame(0.6)], refuse_busy=True)
    noted = calibration_from([_grid_frame(0.6)])  # a notebook's fit: made, and says so
    assert any(n.startswith("fitted anyway") and "40%" in n for n in noted.notes)
    assert noted.interference["noisy_cells"] == 9
