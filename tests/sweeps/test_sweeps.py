"""Sweeps on a small model: documented columns, physics, notes when a size does not fit, bad input."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from explorer import costs, sweeps
from explorer.model import device
from explorer.model.loader import LoadedModel, model_info
from explorer.sweeps import batch_size, dtypes
from explorer.sweeps._common import peaks_for


def _random_llama(name: str, hidden: int, intermediate: int, heads: int) -> LoadedModel:
    """A 4-layer GQA Llama with random weights (vocab 4096, 256 positions, 2 KV heads)."""
    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=4,
        num_attention_heads=heads,
        num_key_value_heads=2,
        vocab_size=4096,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    return LoadedModel(
        model=model,
        tokenizer=None,
        info=model_info(model, name=name, source="arch", random_weights=True),
    )


@pytest.fixture(scope="module")
def small():
    """hidden 256: big enough that recomputing the prefix shows in a timing, small enough to sweep in
    a second."""
    return _random_llama("small-llama", hidden=256, intermediate=512, heads=4)


@pytest.fixture(autouse=True)
def one_thread():
    """Timed physics on one thread: on a shared 2-core machine a 2-thread pool waits for a descheduled
    thread on every op, which buries the effect under noise. The thread count lands in attrs."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _has_documented_columns(df, columns):
    assert list(df.columns) == columns
    assert set(df.attrs["columns"]) == set(columns)
    for key in ("device", "dtype", "repeats", "threads", "timer", "peaks", "notes", "statistic"):
        assert key in df.attrs
    for c in columns:  # every figure says what it is
        if c.endswith(("_s", "_gbps", "_bytes", "flops")):
            pytest.fail(f"column {c} does not say measured / modelled / derived")


@pytest.fixture(scope="module")
def wider():
    """hidden 384: enough FLOPs per token that recomputing a 70-token prefix outweighs the per-pass
    overhead even when the machine is busy."""
    return _random_llama("wider-llama", hidden=384, intermediate=1024, heads=6)


def test_cache_sweep(wider):
    n = 64
    df = sweeps.run("cache", wider, new_tokens=n, prompt_len=8, bar=False)
    _has_documented_columns(df, sweeps.get("cache").columns)
    on, off = df[df.use_cache], df[~df.use_cache]
    assert list(df["mode"].unique()) == ["cache on", "cache off"] and len(on) == len(off) == n
    assert list(on.step) == list(range(n)) and list(on.context_len) == list(range(8, 8 + n))
    per_token = wider.info.kv_bytes_per_token
    assert list(on.kv_cache_bytes_measured) == [per_token * L for L in range(8, 8 + n)]
    assert (off.kv_cache_bytes_measured == 0).all()
    assert list(off.tokens_fed) == list(off.context_len)  # no cache: the whole sequence every pass
    assert off.flops_modelled.sum() > 10 * on.flops_modelled.sum()

    # the physics, modelled (a test checks no timing: `explorer sweep cache` prints the measured
    # halves): without the cache the second half of the run costs more than the first (the prefix
    # it recomputes is longer); with the cache the halves cost about the same
    def halves(part):
        work = list(part.flops_modelled)[1:]
        return sum(work[len(work) // 2 :]) / sum(work[: len(work) // 2])

    assert halves(off) > 1.5 and 0.9 < halves(on) < 1.2
    assert (df.latency_s_measured > 0).all()
    assert all(p.cumulative_s_measured.is_monotonic_increasing for p in (on, off))
    assert df.attrs["threads"] == 1


def test_prefill_sweep(small):
    df = sweeps.run("prefill", small, lengths=(512, 8, 32, 128), repeats=2, bar=False)
    _has_documented_columns(df, sweeps.get("prefill").columns)
    assert df.attrs["notes"] == ["stopped at length 512: beyond the model's 256 positions"]
    pre, dec = df[df.phase == "prefill"], df[df.phase == "decode"]
    assert list(pre.context_len) == list(dec.context_len) == [8, 32, 128]  # sorted, deterministic
    assert (pre.intensity_modelled.values > dec.intensity_modelled.values).all()
    assert dec.bytes_modelled.is_monotonic_increasing  # the KV read grows with context
    assert (
        pre.tokens_per_s_measured.iloc[-1] > pre.tokens_per_s_measured.iloc[0]
    )  # prefill amortises overhead


def test_batch_sweep_total_throughput_rises(small):
    df = sweeps.run("batch", small, batches=(8, 1), context_len=32, repeats=3, bar=False)
    _has_documented_columns(df, sweeps.get("batch").columns)
    assert list(df.batch) == [1, 8]
    b1, b8 = df.iloc[0], df.iloc[1]
    assert b8.tokens_per_s_total_measured > b1.tokens_per_s_total_measured
    assert b8.flops_modelled == pytest.approx(8 * b1.flops_modelled)
    assert b8.intensity_modelled > b1.intensity_modelled
    knee = costs.decode_knee(small.info, context_len=32, peaks=peaks_for(small, None))
    assert df.attrs["knee_batch_modelled"] == knee
    assert (df.knee_batch_modelled.isna() if knee is None else df.knee_batch_modelled == knee).all()
    assert df.attrs["notes"] == []


def test_too_large_batch_is_caught_by_the_memory_precheck(small):
    limit = int(batch_size.batch_memory_bytes(small.info, 4, 32) / 0.9) + 1
    df = sweeps.run(
        "batch",
        small,
        batches=(1, 2, 4, 8, 16),
        context_len=32,
        repeats=1,
        bar=False,
        memory_limit_bytes=limit,
    )
    assert list(df.batch) == [1, 2, 4]
    assert len(df.attrs["notes"]) == 1 and df.attrs["notes"][0].startswith(
        "stopped at B=8: needs about"
    )


def test_out_of_memory_error_ends_the_sweep_with_a_note(small, monkeypatch):
    real = batch_size.time_decode

    def failing(model, cache, feed, **kw):
        if feed.shape[0] >= 4:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(model, cache, feed, **kw)

    monkeypatch.setattr(batch_size, "time_decode", failing)
    df = sweeps.run("batch", small, batches=(1, 2, 4, 8), context_len=16, repeats=1, bar=False)
    assert list(df.batch) == [1, 2]
    assert df.attrs["notes"] == [
        "stopped at B=4: out of memory (CUDA out of memory. Tried to allocate 2.00 GiB)"
    ]


def test_other_errors_are_not_swallowed(small, monkeypatch):
    def broken(*a, **kw):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(batch_size, "time_decode", broken)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        sweeps.run("batch", small, batches=(1,), context_len=16, repeats=1, bar=False)


def test_dtype_sweep(small):
    df = sweeps.run(
        "dtype", small, dtypes=("float32", "bf16"), context_len=16, repeats=1, bar=False
    )
    _has_documented_columns(df, sweeps.get("dtype").columns)
    assert list(df.dtype) == ["float32", "bfloat16"] and df.supported.all()
    fp32, bf16 = df.iloc[0], df.iloc[1]
    assert bf16.weight_bytes_counted * 2 == fp32.weight_bytes_counted == small.info.weight_bytes
    assert (
        bf16.kv_cache_bytes_measured * 2
        == fp32.kv_cache_bytes_measured
        == 16 * small.info.kv_bytes_per_token
    )
    assert bf16.bytes_modelled < 0.55 * fp32.bytes_modelled
    assert (
        small.model.dtype == torch.float32
    )  # the caller's model is untouched (a converted copy was used)


def test_unsupported_dtype_is_a_row_and_a_note(small, monkeypatch):
    monkeypatch.setattr(dtypes, "dtype_supported", lambda dev, dt: dt == torch.float32)
    df = sweeps.run(
        "dtype", small, dtypes=("float32", "float16"), context_len=8, repeats=1, bar=False
    )
    assert list(df.supported) == [True, False]
    assert df.attrs["notes"] == ["float16: not supported on cpu"]


def test_progress_callback_reaches_total(small):
    calls = []
    sweeps.run(
        "batch",
        small,
        batches=(1, 2),
        context_len=8,
        repeats=2,
        bar=False,
        progress=lambda done, total: calls.append((done, total)),
    )
    assert calls == [(1, 4), (2, 4), (3, 4), (4, 4)]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda lm: sweeps.run("batch", lm, batches=(1, -4), bar=False), "batches"),
        (lambda lm: sweeps.run("batch", lm, batches=(), bar=False), "at least one"),
        (
            lambda lm: sweeps.run("batch", lm, context_len=1000, bar=False),
            "needs 1,000 positions, more than .*context of 256 positions",
        ),
        (lambda lm: sweeps.run("batch", lm, context_len=1, bar=False), "context_len"),
        (lambda lm: sweeps.run("batch", lm, repeats=0, bar=False), "repeats"),
        (lambda lm: sweeps.run("cache", lm, new_tokens=300, bar=False), "positions, more than"),
        (lambda lm: sweeps.run("cache", lm, new_tokens=0, bar=False), "new_tokens"),
        (lambda lm: sweeps.run("prefill", lm, lengths=(0, 8), bar=False), "lengths"),
        (lambda lm: sweeps.run("dtype", lm, dtypes=("float8",), bar=False), "unknown dtype"),
        (lambda lm: sweeps.run("dtype", lm, dtypes=(), bar=False), "at least one dtype"),
    ],
)
def test_bad_input_raises_clear_errors(small, call, message):
    with pytest.raises(ValueError, match=message):
        call(small)


def test_out_of_memory_detection():
    assert device.is_out_of_memory(torch.OutOfMemoryError("x"))
    assert device.is_out_of_memory(MemoryError())
    assert device.is_out_of_memory(
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried...")
    )
    assert not device.is_out_of_memory(RuntimeError("size mismatch"))


def test_free_memory_is_known_where_the_os_reports_it():
    import os

    if not os.path.exists("/proc/meminfo"):
        pytest.skip("no /proc/meminfo on this machine: free CPU memory is unknown here")
    free = device.available_bytes(torch.device("cpu"))
    assert free is not None and free > 0
    assert device.available_bytes("meta") is None  # a device with no memory to ask about


def test_cli_sweep_writes_table_and_notes(tmp_path, capsys):
    import json

    import pandas as pd

    from explorer.cli import main

    out = tmp_path / "batch.csv"
    assert (
        main(
            [
                "sweep",
                "batch",
                "--model",
                "arch:smollm2-135m",
                "--batches",
                "1,2",
                "--context",
                "8",
                "--repeats",
                "1",
                "--csv",
                str(out),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "tokens_per_s_total_measured" in text and "roofline knee" in text
    df = pd.read_csv(out)
    assert list(df.columns) == sweeps.get("batch").columns and list(df.batch) == [1, 2]
    attrs = json.loads((tmp_path / "batch.csv.attrs.json").read_text())
    assert attrs["sweep"] == "batch" and attrs["notes"] == []
    assert main(["sweep", "cache", "--model", "arch:smollm2-135m", "--batches", "1,2"]) == 2
    assert "unrecognized arguments: --batches" in capsys.readouterr().err


def test_a_sweeps_threads_flag_sets_torchs_threads_and_refuses_zero(monkeypatch, capsys):
    from explorer import ModelNotFoundError
    from explorer.cli import main
    from explorer.model import loader

    assert main(["sweep", "batch", "--threads", "0"]) == 2
    err = capsys.readouterr().err
    assert "--threads" in err and "whole number >= 1" in err
    seen = []
    monkeypatch.setattr(torch, "set_num_threads", seen.append)

    def no_model(*args, **kwargs):
        raise ModelNotFoundError("no model here")

    monkeypatch.setattr(loader, "load", no_model)  # stops the run right after the threads are set
    assert main(["sweep", "batch", "--threads", "1", "--batches", "1"]) == 2
    assert seen == [1]
