"""The moe sweep on a tiny random-weight Qwen3-MoE: routing read from the router, bounds, dense refusal."""

from __future__ import annotations

import pytest
from moe_helpers import tiny_moe

from explorer import sweeps
from explorer.costs.hardware import Peaks
from explorer.inside import hook_count
from explorer.sweeps import moe


@pytest.fixture(scope="module")
def lm():
    return tiny_moe()


@pytest.fixture(scope="module")
def df(lm):
    peaks = Peaks("cpu", "float32", bandwidth_gbps=10.0, flops=1e11, method="modelled")
    return sweeps.run("moe", lm, batches=[1, 4], context_len=8, repeats=1, peaks=peaks, bar=False)


def test_rows_have_documented_columns(df):
    assert list(df.columns) == moe.COLUMNS and set(df.attrs["columns"]) == set(moe.COLUMNS)
    assert list(df["batch"]) == [1, 4] and df.attrs["experts"] == 16


def test_touched_between_k_and_e(df):
    for _, row in df.iterrows():
        assert all(2 <= t <= 16 for t in row["experts_touched_per_layer"])
        assert len(row["experts_touched_per_layer"]) == 2  # one count per MoE layer
        assert 2 <= row["experts_touched_formula"] <= 16
    one = df.iloc[0]
    assert one["experts_touched_per_layer"] == [2, 2], "one token reads exactly its k experts"
    assert one["experts_touched_formula"] == pytest.approx(2.0)


def test_bytes_between_active_and_total(df):
    for _, row in df.iterrows():
        assert (
            row["bytes_per_step_dense_active_modelled"]
            <= row["bytes_per_step"]
            <= row["bytes_per_step_dense_total_modelled"]
        )
    one, four = df.iloc[0], df.iloc[1]
    assert one["bytes_per_step"] == one["bytes_per_step_dense_active_modelled"]
    assert four["bytes_per_step"] > one["bytes_per_step"]  # more experts touched, more bytes
    assert four["flops_per_token_modelled"] == pytest.approx(one["flops_per_token_modelled"])
    assert set(df["regime"]) <= {"memory", "compute", "overhead"}
    assert (df["ms_per_step"] > 0).all()


def test_no_hook_left_after_the_sweep(lm, df):
    assert hook_count(lm.model) == 0


def test_dense_model_refused_in_one_line(target):
    with pytest.raises(ValueError, match="dense model") as err:
        sweeps.run("moe", target, batches=[1], repeats=1, bar=False)
    assert "\n" not in str(err.value)


def test_chart_draws_the_rows(df):
    from explorer import plots

    fig = plots.sweep("moe", df)
    traces = {t.name: t for t in fig.data}
    assert list(traces["experts touched per layer (measured)"].y) == list(df["experts_touched"])
    assert fig.layout.shapes[0].y0 == 16  # E: the most a batch can touch
