"""The optimisation ladder sweep: one row per rung and batch, quality against the eager baseline."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from explorer import plots, sweeps
from explorer.model.corpus import heldout_documents, is_validation_doc, pydoc_topic_documents
from explorer.sweeps import ladder

RUNGS = ["static", "bf16", "int8:fbgemm", "int4", "prompt lookup", "prefix cache"]


@pytest.fixture(scope="module")
def table(target):
    return ladder.run(target, rungs=RUNGS, batches=[1, 2], new_tokens=8, bar=False)


def test_one_row_per_rung_and_batch_with_the_baseline_first(table):
    assert list(table.columns) == ladder.COLUMNS
    assert list(table["rung"]) == ["eager", *RUNGS] * 2
    assert list(table["batch"]) == [1] * 7 + [2] * 7
    for c in ladder.COLUMNS:
        assert c in table.attrs["columns"]  # every column described
    eager = table[table["rung"] == "eager"]
    assert (eager["speedup"] == 1.0).all() and eager["greedy_equal"].all()


def test_rungs_that_cannot_run_here_are_rows_with_the_reason(table):
    by = {(r.rung, r.batch): r for r in table.itertuples()}
    if torch.cuda.is_available():
        pytest.skip("int4 runs on CUDA")
    assert "int4" in by["int4", 1].skipped and "cpu" in by["int4", 1].skipped
    assert "batch 1" in by["prompt lookup", 2].skipped
    assert pd.isna(by["static", 1].skipped) and by["static", 1].ms_per_token > 0


def test_static_cache_is_lossless_and_int8_moves_about_a_quarter_of_the_weight_bytes(table):
    b1 = table[table["batch"] == 1].set_index("rung")
    assert b1.loc["static", "greedy_equal"] and b1.loc["static", "max_abs_logit_diff"] < 1e-3
    assert b1.loc["static", "bytes_per_step"] == b1.loc["eager", "bytes_per_step"]
    # the weight bytes fall to ~1/4; the fp32 KV cache and activations do not
    assert b1.loc["int8:fbgemm", "bytes_per_step"] < 0.35 * b1.loc["eager", "bytes_per_step"]
    assert b1.loc["bf16", "bytes_per_step"] == pytest.approx(
        0.5 * b1.loc["eager", "bytes_per_step"], rel=0.05
    )
    assert 0 < b1.loc["eager", "pct_of_copy_bw"] < 100
    assert b1.loc["int8:fbgemm", "max_abs_logit_diff"] > 0  # a different number format


def test_perplexity_is_of_the_weights_on_held_out_text(table):
    b1 = table[table["batch"] == 1].set_index("rung")
    fp32 = b1.loc["eager", "perplexity"]
    assert 5 < fp32 < 200  # a trained model on its own kind of text (training.json: val ppl ~62)
    assert b1.loc["static", "perplexity"] == fp32  # the same weights
    assert abs(b1.loc["int8:fbgemm", "perplexity"] / fp32 - 1) < 0.05
    assert b1.loc["int8:fbgemm", "perplexity"] != fp32
    assert "held out" in table.attrs["perplexity_text"]


def test_the_held_out_documents_were_never_trained_on():
    docs = pydoc_topic_documents()
    held = heldout_documents()
    assert held and len(held) < 0.2 * len(docs)
    assert all(is_validation_doc(d) for d in held)
    assert not any(is_validation_doc(d) for d in docs if d not in held)


def test_prompt_lookup_is_lossless_and_prefix_caching_is_a_ttft_rung(table):
    b1 = table[table["batch"] == 1].set_index("rung")
    assert b1.loc["prompt lookup", "greedy_equal"]
    assert b1.loc["prefix cache", "speedup_of"] == "ttft_ms"
    # 256 of its prompt tokens come from the cache, and the row says so
    assert any(n.startswith("prefix cache: 256 of ") for n in table.attrs["notes"])
    assert b1.loc["prefix cache", "ttft_ms"] > 0
    assert b1.loc["prefix cache", "max_abs_logit_diff"] < 1e-4


def test_a_diverging_rung_is_teacher_forced_on_the_baseline_tokens():
    base = {"_tokens": [1, 2, 3], "_logits": [torch.zeros(4)] * 3}
    own = [torch.zeros(4), torch.zeros(4), torch.full((4,), 9.0)]  # off the baseline's path
    forced = [torch.zeros(4), torch.full((4,), 0.5), torch.zeros(4)]
    q = ladder._Ladder._quality([1, 2, 7], own, base, lambda: forced)
    assert q == {"greedy_equal": False, "first_divergence": 2, "max_abs_logit_diff": 0.5}
    same = ladder._Ladder._quality([1, 2, 3], forced, base, lambda: pytest.fail("not needed"))
    assert same["greedy_equal"] and same["first_divergence"] is None


def test_random_weights_have_no_perplexity_and_say_why(tiny_arch):
    df = ladder.run(tiny_arch, rungs=["static"], new_tokens=3, bar=False)
    assert df["perplexity"].isna().all()
    assert any("random weights" in n for n in df.attrs["notes"])


def test_bad_input_is_refused_before_anything_runs(target):
    with pytest.raises(ValueError, match="unknown rung 'turbo'"):
        ladder.run(target, rungs=["turbo"], bar=False)
    with pytest.raises(ValueError, match="positions"):
        ladder.run(target, new_tokens=100_000, bar=False)
    with pytest.raises(ValueError, match="new_tokens"):
        ladder.run(target, new_tokens=1, bar=False)


def test_the_chart_draws_every_row(table):
    fig = plots.sweep("ladder", table)
    bars = {t.name: t for t in fig.data}
    assert len(bars["ms/token (measured)"].x) == len(table)
    assert any("(skipped)" in x for x in bars["ms/token (measured)"].x)
    assert bars["perplexity change % (measured)"].y[0] == 0


def test_cli_json_rows_carry_the_promised_keys(capsys):
    from explorer.cli import main

    code = main(["sweep", "ladder", "--rungs", "static,int4", "--new-tokens", "3", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    keys = {
        "rung", "batch", "ms_per_token", "bytes_per_token", "pct_of_copy_bw", "speedup",
        "greedy_equal", "max_abs_logit_diff", "perplexity", "compile_s", "skipped",
    }  # fmt: skip
    assert [r["rung"] for r in out["rows"]] == ["eager", "static", "int4"]
    assert all(keys <= set(r) for r in out["rows"])
    assert "ladder" in sweeps.names()
