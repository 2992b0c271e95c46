"""The pays sweep's serving tricks (explorer.sweeps.pays.serving) on tiny workloads: the row format,
a rate past saturation marked unstable and kept out of the speedup, the long prompt's TTFT kept."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from explorer import sweeps
from explorer.costs.hardware import Peaks
from explorer.sweeps import pays
from explorer.sweeps.pays import serving

PEAKS = Peaks(device="cpu", dtype="float32", bandwidth_gbps=10.0, flops=1e11, method="modelled")
TINY = dict(num_prompts=4, input_len=8, output_len=4, max_batch=2)


@pytest.mark.slow
def test_a_rate_past_saturation_is_marked_unstable_and_never_averaged(target, monkeypatch):
    run = serving._run

    def judged(ctx, requests, engine, knobs):  # the trend test's verdict, made up past 100 req/s
        res = run(ctx, requests, engine, knobs)
        rate = requests[-1].arrival_s and (len(requests) - 1) / requests[-1].arrival_s
        if rate and rate > 100:
            res.result.update(steady=False, stability="unstable: made up for the test")
        return res

    monkeypatch.setattr(serving, "_run", judged)
    df = sweeps.run("pays", target, trick="continuous", over="rate", values=[20, 400, 800],
                    repeats=1, bar=False, peaks=PEAKS, **TINY)  # fmt: skip
    assert list(df.columns) == pays.ROW_KEYS and list(df["value"]) == [20, 400, 800]
    first, past, beyond = df.to_dict("records")
    assert pd.isna(first["skipped"]) and first["speedup"] == pytest.approx(
        first["baseline_s"] / first["trick_s"]
    )
    assert first["regime"] in ("memory", "compute", "overhead") and "newcomer" in first["why"]
    assert past["skipped"].startswith("unstable") and math.isnan(past["speedup"])
    assert "static: unstable" in past["why"] and "continuous: unstable" in past["why"]
    assert beyond["skipped"].startswith("not run") and math.isnan(beyond["speedup"])
    assert df.attrs["crossover_measured"] is None or df.attrs["crossover_measured"] < 400
    # the measured row keeps the spread of its runs' latencies; the rows not measured have none
    assert df.attrs["spread_pct"][0] == 0.0 and df.attrs["spread_pct"][2] is None


@pytest.mark.slow
def test_chunked_prefill_rows_keep_the_long_prompts_ttft(target):
    df = sweeps.run("pays", target, trick="chunked-prefill", values=[8, 64], repeats=1, bar=False,
                    peaks=PEAKS, long_len=40, short_prompts=2, short_output=6)  # fmt: skip
    assert list(df.columns) == pays.ROW_KEYS and list(df["value"]) == [8, 64]
    assert df.attrs["long_prompt_len"] == 40 and set(df.attrs["long_prompt_ttft_s"]) == {8, 64}
    for row in df.to_dict("records"):
        assert row["baseline_s"] > 0 and row["trick_s"] > 0 and row["how"] == pays.MEASURED
        assert row["regime"] in ("memory", "compute", "overhead")
        assert "40-token prompt" in row["why"] and "TTFT" in row["why"]
        ttft = df.attrs["long_prompt_ttft_s"][row["value"]]
        assert ttft["baseline"] > 0 and ttft["trick"] > 0
