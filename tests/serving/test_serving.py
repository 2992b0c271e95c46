"""The serving lab: workloads, vLLM's metrics, the four engines on the bundled target, bad input.

The http engine is tested against a real `transformers serve --continuous-batching` process on
127.0.0.1 (tests/serving/test_serving_http.py); nothing here leaves this machine."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import torch

from explorer.serving import (
    RequestRecord,
    ServingResult,
    Workload,
    WorkloadError,
    parse_goodput,
    save_requests,
    serve,
    summarise,
)

# --- workloads -----------------------------------------------------------------------------------


def test_workload_is_seeded_and_round_trips(target, tmp_path):
    w = Workload(
        num_prompts=12,
        arrival="poisson",
        request_rate=5.0,
        input_len=20,
        input_dist="uniform",
        input_spread=0.5,
        output_len=8,
        output_dist="lognormal",
        output_spread=0.3,
        shared_prefix_fraction=0.5,
        shared_prefix_len=6,
        seed=3,
    )
    a, b = w.requests(target), w.requests(target)
    assert [r.to_dict() for r in a] == [r.to_dict() for r in b]
    other = Workload(**{**w.to_dict(), "seed": 4}).requests(target)
    assert [r.prompt_ids for r in other] != [r.prompt_ids for r in a]
    # lengths follow the distribution; arrivals rise; half share a 6-token prefix
    assert all(10 <= len(r.prompt_ids) <= 30 for r in a)
    assert len({len(r.prompt_ids) for r in a}) > 1
    assert [r.arrival_s for r in a] == sorted(r.arrival_s for r in a) and a[0].arrival_s == 0
    assert len({tuple(r.prompt_ids[:6]) for r in a[:6]}) == 1
    assert len({tuple(r.prompt_ids[:6]) for r in a[6:]}) == 6
    # JSON settings round trip
    w.save(tmp_path / "w.json")
    assert Workload.load(tmp_path / "w.json") == w
    # a JSONL trace replays the same requests
    save_requests(tmp_path / "trace.jsonl", a)
    again = Workload.load(tmp_path / "trace.jsonl").requests(target)
    assert [(r.prompt_ids, r.max_tokens, r.arrival_s) for r in again] == [
        (r.prompt_ids, r.max_tokens, r.arrival_s) for r in a
    ]


def test_text_prompts_in_a_trace_are_tokenized(target, tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"prompt": "def add(a, b):", "max_tokens": 5}\n\n{"prompt": [5, 6, 7], "arrival_s": 0.5}\n'
    )
    reqs = Workload.load(path).requests(target)
    assert reqs[0].prompt_ids == target.tokenizer("def add(a, b):")["input_ids"]
    assert (reqs[1].prompt_ids, reqs[1].max_tokens, reqs[1].arrival_s) == ([5, 6, 7], 32, 0.5)


def test_arrival_processes_have_the_asked_rate_and_burstiness():
    def gaps(**kw):
        times = Workload(num_prompts=4000, request_rate=10.0, **kw).arrival_times()
        return np.diff(times)

    assert np.allclose(gaps(arrival="fixed"), 0.1)
    for kw, cv2 in (
        ({"arrival": "poisson"}, 1.0),
        ({"arrival": "gamma", "burstiness": 0.25}, 4.0),
        ({"arrival": "gamma", "burstiness": 4.0}, 0.25),
    ):
        g = gaps(**kw)
        assert abs(g.mean() - 0.1) < 0.012, kw  # mean gap 1/rate
        assert abs(g.var() / g.mean() ** 2 - cv2) < 0.25 * cv2, kw  # gamma: CV^2 = 1/shape
    assert Workload(num_prompts=5).arrival_times() == [0.0] * 5


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"arrival": "poisson", "request_rate": 0}, "request rate must be > 0"),
        ({"arrival": "poisson", "request_rate": -2.0}, "request rate must be > 0"),
        ({"arrival": "poisson"}, "request rate must be > 0"),
        ({"max_concurrency": 0}, "max concurrency must be a whole number >= 1"),
        ({"num_prompts": 0}, "num_prompts must be a whole number >= 1"),
        ({"arrival": "weekly"}, "arrival must be one of"),
        ({"input_dist": "zipf"}, "input_dist must be one of"),
        ({"shared_prefix_fraction": 0.5, "shared_prefix_len": 40}, "shared_prefix_len must be"),
    ],
)
def test_bad_workload_settings_name_the_setting(kw, message):
    with pytest.raises(WorkloadError, match=message):
        Workload(**kw)


@pytest.mark.parametrize(
    "lines, message",
    [
        ('{"prompt": "a"}\n{"prompt": "b", "max_tokens": 3\n', r"line 2: not JSON"),
        ('{"prompt": "a"}\n\n{"max_tokens": 3}\n', r"line 3: expected an object with a 'prompt'"),
        ('{"prompt": "a", "max_tokens": 0}\n', r"line 1: 'max_tokens' must be a whole number >= 1"),
        (
            '{"prompt": [1, "x"]}\n',
            r"line 1: 'prompt' must be non-empty text or a list of token ids",
        ),
        ('{"prompt": "a", "arrival_s": -1}\n', r"line 1: 'arrival_s' must be a number >= 0"),
        ("\n\n", "no requests in the file"),
    ],
)
def test_malformed_jsonl_names_the_line(tmp_path, lines, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(lines)
    with pytest.raises(WorkloadError, match=message):
        Workload.load(path)


# --- metrics -------------------------------------------------------------------------------------


def _record(i, sent, times, n_in=10):
    return RequestRecord(
        f"r{i}",
        n_in,
        len(times),
        0.0,
        sent_s=sent,
        start_s=sent + 0.01,
        token_s=list(times),
        end_s=times[-1],
        output_len=len(times),
    )


def test_metrics_follow_vllms_definitions():
    recs = [
        _record(0, 0.0, [0.10, 0.15, 0.25, 0.30]),
        _record(1, 0.05, [0.40, 0.42]),
        _record(2, 0.20, [0.30]),  # one token: no TPOT
        RequestRecord("r3", 7, 4, 0.0, sent_s=0.2, error="stopped before it finished"),
    ]
    r = summarise(recs, {"ttft": 200, "tpot": 60})
    assert (r["completed"], r["failed"]) == (3, 1)
    assert r["duration"] == pytest.approx(0.42)
    assert r["total_output_tokens"] == 7 and r["total_input_tokens"] == 30
    assert r["output_throughput"] == pytest.approx(7 / 0.42)
    assert r["ttfts"] == pytest.approx([0.10, 0.35, 0.10])
    assert r["mean_ttft_ms"] == pytest.approx(1e3 * (0.10 + 0.35 + 0.10) / 3)
    # TPOT = (E2E - TTFT) / (output tokens - 1): 0.2/3 and 0.02/1
    assert r["median_tpot_ms"] == pytest.approx(1e3 * np.median([0.2 / 3, 0.02]))
    itl = [0.05, 0.10, 0.05, 0.02]
    assert r["itls"][0] == pytest.approx(itl[:3]) and r["itls"][2] == []
    assert r["p99_itl_ms"] == pytest.approx(np.percentile(np.array(itl) * 1e3, 99))
    assert r["median_e2el_ms"] == pytest.approx(1e3 * np.median([0.30, 0.37, 0.10]))
    assert r["mean_queue_ms"] == pytest.approx(10.0)
    # goodput: r0 (ttft 100, tpot 67 > 60) fails, r1 (ttft 350) fails, r2 passes
    assert r["request_goodput"] == pytest.approx(1 / 0.42)
    assert r["errors"] == ["stopped before it finished"]
    assert r["max_concurrent_requests"] == 3


def test_goodput_parsing():
    assert parse_goodput(["ttft:500", "tpot:50"]) == {"ttft": 500.0, "tpot": 50.0}
    assert parse_goodput("e2el:2000") == {"e2el": 2000.0}
    for bad, message in (
        ("latency:5", "unknown SLO"),
        ("ttft:fast", "needs a number"),
        ("tpot:0", "must be a finite number of ms > 0"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_goodput([bad])


def _recompute(rec: RequestRecord):
    t = rec.token_s
    ttft, e2e = t[0] - rec.sent_s, rec.end_s - rec.sent_s
    tpot = (e2e - ttft) / (rec.output_len - 1)
    return ttft, tpot, list(np.diff(t)), e2e


# --- the engines on the bundled target ------------------------------------------------------------

SIXTEEN = Workload(
    num_prompts=16, input_len=24, input_dist="uniform", input_spread=0.5, output_len=32, seed=1
)


@pytest.fixture(scope="module")
def runs(target):
    """16 requests x 32 greedy tokens (prompts 12-36 tokens) through each local engine."""
    return {
        "sequential": serve(target, SIXTEEN, "sequential"),
        "static": serve(target, SIXTEEN, "static", max_batch=6),
        "continuous": serve(
            target, SIXTEEN, "continuous", num_blocks=32, page_size=16, max_batch_tokens=96
        ),
    }


def _first_difference(lm, req, alone: list[int], other: list[int]):
    """(position, top-2 logit margin of the alone run there) at the first differing token."""
    k = next(i for i, (a, b) in enumerate(zip(alone, other)) if a != b)
    ids = torch.tensor([req.prompt_ids + alone[:k]], device=lm.device)
    with torch.no_grad():
        logits = lm.model(ids).logits[0, -1].float()
    top = torch.topk(logits, 2).values
    return k, float(top[0] - top[1])


@pytest.mark.parametrize("engine", ["static", "continuous"])
def test_batched_engines_give_each_request_its_tokens_alone(target, runs, engine):
    reqs = {r.id: r for r in SIXTEEN.requests(target)}
    alone = {r.id: r.output_ids for r in runs["sequential"].records}
    assert all(len(v) == 32 for v in alone.values())
    for rec in runs[engine].records:
        assert rec.ok, rec.error
        if rec.output_ids != alone[rec.id]:
            k, margin = _first_difference(target, reqs[rec.id], alone[rec.id], rec.output_ids)
            assert margin < 1e-3, (
                f"{engine}: {rec.id} differs from its run alone at token {k}, where the top-2 "
                f"logit margin is {margin:.4f} (not a near-tie)"
            )


@pytest.mark.parametrize("engine", ["sequential", "static", "continuous"])
def test_metrics_equal_a_recomputation_from_raw_timestamps(runs, engine):
    res = runs[engine]
    done = [r for r in res.records if r.ok]
    assert len(done) == 16 and res.meta["status"] == "complete"
    parts = [_recompute(r) for r in done]
    ttft, tpot, itl, e2e = (np.array([p[i] for p in parts]) for i in (0, 1, 3, 3))
    itl = np.concatenate([p[2] for p in parts]) * 1e3
    r = res.result
    assert r["median_ttft_ms"] == pytest.approx(np.median(ttft) * 1e3)
    assert r["p99_ttft_ms"] == pytest.approx(np.percentile(ttft * 1e3, 99))
    assert r["mean_tpot_ms"] == pytest.approx(np.mean(np.array([p[1] for p in parts])) * 1e3)
    assert r["p90_itl_ms"] == pytest.approx(np.percentile(itl, 90))
    assert r["median_e2el_ms"] == pytest.approx(np.median(e2e) * 1e3)
    starts = min(x.sent_s for x in done)
    assert r["duration"] == pytest.approx(max(x.end_s for x in done) - starts)
    assert r["output_throughput"] == pytest.approx(16 * 32 / r["duration"])
    for rec in done:  # the clock is one clock: sent <= start <= first token <= ... <= end
        assert rec.sent_s <= rec.start_s + 1e-6 <= rec.token_s[0] + 2e-6
        assert rec.token_s == sorted(rec.token_s) and rec.token_s[-1] <= rec.end_s + 1e-6
    del tpot


def test_static_batches_wait_for_their_longest_request(runs):
    res = runs["static"]
    # 16 requests in batches of at most 6: 3 batches, each one prefill pass + 31 decode passes
    prefills = [i for i in res.iterations if i.prefill_requests]
    assert [i.prefill_requests for i in prefills] == [6, 6, 4]
    assert len(res.iterations) == 3 * 32
    first = sorted(res.records, key=lambda r: r.start_s)[:6]
    later = sorted(res.records, key=lambda r: r.start_s)[6:12]
    assert min(r.start_s for r in later) >= max(r.end_s for r in first) - 1e-6  # head of line


def test_continuous_iterations_come_from_the_engines_state(target, runs):
    res = runs["continuous"]
    its = res.iterations
    assert its and all(i.kv_blocks_total == 32 for i in its)
    assert all(0 <= i.kv_blocks_used <= 32 for i in its)
    assert all(i.batch_tokens <= 96 for i in its)  # max_batch_tokens caps every pass
    inputs = sum(r.input_len for r in res.records)
    assert sum(i.prefill_tokens for i in its) >= inputs  # every prompt was prefilled (chunks)
    assert max(i.prefill_requests for i in its) > 1 and max(i.decode_requests for i in its) > 1
    # requests join and leave: some iteration mixes prefill with decoding
    assert any(i.prefill_requests and i.decode_requests for i in its)
    # 16 requests of up to 68 tokens need more than 32 blocks of 16: the engine evicts some, and
    # an evicted request is prefilled again (its prompt and what it generated) for its next token
    preempted = sum(i.preempted for i in its)
    assert preempted > 0
    # so every output token after a request's first comes from a decode slot or a re-prefill
    assert sum(i.decode_requests for i in its) + preempted == sum(
        r.output_len - 1 for r in res.records
    )


def test_continuous_beats_sequential_when_requests_arrive_together(runs):
    seq = runs["sequential"].result["output_throughput"]
    cb = runs["continuous"].result["output_throughput"]
    assert cb > 1.5 * seq  # the benchmark measures the 3x target; this only checks the direction


def test_a_small_kv_budget_preempts_or_queues(target):
    wl = Workload(num_prompts=8, input_len=40, output_len=24, seed=2)
    res = serve(target, wl, "continuous", num_blocks=6, page_size=16, max_batch_tokens=128)
    assert res.result["completed"] == 8
    assert max(i.kv_blocks_used for i in res.iterations) <= 6
    # 8 requests x 4 blocks need 32 blocks: most of them wait, so TTFT spreads out
    assert max(i.waiting or 0 for i in res.iterations) > 0
    ttfts = sorted(res.result["ttfts"])
    assert ttfts[-1] > 2 * ttfts[0]


def test_closed_loop_keeps_concurrency(target):
    wl = Workload(num_prompts=6, input_len=8, output_len=6, max_concurrency=2)
    res = serve(target, wl, "continuous")
    assert res.result["completed"] == 6
    assert res.result["max_concurrent_requests"] <= 2


# --- results on disk, vLLM's files --------------------------------------------------------------

VLLM_KEYS = (
    "completed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "mean_e2el_ms",
    "ttfts",
    "itls",
    "input_lens",
    "output_lens",
    "duration",
    "generated_texts",
    "errors",
    "request_goodput",
)


def test_result_file_has_vllms_keys_and_loads_back(runs, tmp_path):
    res = runs["continuous"]
    res.save(tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    assert set(VLLM_KEYS) <= set(data)
    back = ServingResult.load(tmp_path / "r.json")
    assert [r.token_s for r in back.records] == [r.token_s for r in res.records]
    assert [i.kv_blocks_used for i in back.iterations] == [i.kv_blocks_used for i in res.iterations]
    assert back.result["median_ttft_ms"] == res.result["median_ttft_ms"]


def test_a_vllm_result_file_loads_into_the_views(tmp_path):
    """A file as `vllm bench serve --save-result` writes it (no per-request arrival times)."""
    from explorer.plots.serving import cdf_figure, gantt_figure

    vllm = {
        "date": "20261201-101500",
        "backend": "vllm",
        "model_id": "Qwen/Qwen2.5-7B-Instruct",
        "tokenizer_id": "Qwen/Qwen2.5-7B-Instruct",
        "num_prompts": 3,
        "request_rate": "inf",
        "burstiness": 1.0,
        "max_concurrency": None,
        "duration": 1.9,
        "completed": 3,
        "total_input_tokens": 3072,
        "total_output_tokens": 384,
        "request_throughput": 1.58,
        "request_goodput": None,
        "output_throughput": 202.1,
        "total_token_throughput": 1818.9,
        "input_lens": [1024, 1024, 1024],
        "output_lens": [128, 128, 128],
        "ttfts": [0.051, 0.062, 0.070],
        "itls": [[0.011] * 127, [0.012] * 127, [0.013] * 127],
        "generated_texts": ["", "", ""],
        "errors": ["", "", ""],
        "mean_ttft_ms": 61.0,
        "median_ttft_ms": 62.0,
        "p99_ttft_ms": 69.8,
    }
    path = tmp_path / "vllm.json"
    path.write_text(json.dumps(vllm))
    res = ServingResult.load(path)
    assert res.label.startswith("vllm") and len(res.records) == 3
    assert [r.ttft for r in res.records] == pytest.approx(vllm["ttfts"])
    assert res.records[2].itl == pytest.approx([0.013] * 127)
    assert res.records[0].tpot == pytest.approx(0.011)
    assert len(gantt_figure(res).data) > 0 and len(cdf_figure([res]).data) > 0
    (tmp_path / "not.json").write_text('{"ttfts": []}')
    with pytest.raises(ValueError, match="not a serving result"):
        ServingResult.load(tmp_path / "not.json")


# --- bad input and stopping ------------------------------------------------------------------------


def test_a_request_longer_than_the_context_fails_before_the_run(target):
    limit = target.info.max_positions
    wl = Workload(num_prompts=2, input_len=limit - 4, output_len=8)
    for engine in ("sequential", "static", "continuous"):
        with pytest.raises(ValueError, match=f"more than .*context of {limit:,} positions"):
            serve(target, wl, engine)


def test_a_kv_budget_too_small_for_one_request_fails_before_the_run(target):
    wl = Workload(num_prompts=2, input_len=40, output_len=30)
    with pytest.raises(
        ValueError, match=r"needs 70 KV slots .* the KV budget holds 64 \(4 blocks x 16"
    ):
        serve(target, wl, "continuous", num_blocks=4, page_size=16)


@pytest.mark.parametrize(
    "engine, knobs, message",
    [
        ("batched", {}, "unknown engine 'batched'"),
        ("static", {"max_batch": 0}, r"static engine: max_batch \(max batch\) must be a whole "),
        ("continuous", {"num_blocks": 0}, "num_blocks .*must be a whole number >= 1"),
        ("continuous", {"scheduler": "lifo"}, "scheduler must be one of fifo, prefill_first"),
        ("continuous", {"block_size": 16}, "the continuous engine has no knob block_size"),
        ("http", {"base_url": "localhost:8000"}, "must start with http://"),
    ],
)
def test_bad_engine_knobs_are_clear(target, engine, knobs, message):
    with pytest.raises(ValueError, match=message):
        serve(target, Workload(num_prompts=1), engine, **knobs)


@pytest.mark.parametrize("engine", ["sequential", "static", "continuous"])
def test_stop_mid_run_keeps_what_finished(target, engine, monkeypatch):
    from explorer.serving.engines._feed import Feeder

    wl = Workload(num_prompts=12, arrival="fixed", request_rate=8.0, input_len=16, output_len=24)
    stop = threading.Event()
    done = Feeder.done

    def stop_after_the_first(feeder, record):  # Stop pressed once a request has finished
        done(feeder, record)
        stop.set()

    monkeypatch.setattr(Feeder, "done", stop_after_the_first)
    res = (
        serve(target, wl, engine, stop=stop, max_batch=2)
        if engine == "static"
        else serve(target, wl, engine, stop=stop)
    )
    r = res.result
    assert res.meta["status"] == "partial"
    assert r["completed"] >= 1 and r["failed"] >= 1 and r["completed"] + r["failed"] == 12
    assert all(e.startswith("stopped before it") for e in r["errors"])
    assert all(len(x.output_ids or []) == 24 for x in res.records if x.ok)


def test_a_stopped_sweep_keeps_its_rows(target):
    from explorer.sweeps import serving as serving_sweep

    stop = threading.Event()
    seen = []

    def progress(done, total):
        seen.append(done)
        if done == 2:
            stop.set()

    df = serving_sweep.run(
        target,
        over="rate",
        values=[4, 8, 16, 32],
        num_prompts=6,
        input_len=8,
        output_len=8,
        progress=progress,
        bar=False,
        stop=stop,
    )
    assert 2 <= len(df) < 4
    assert list(df["value"][:2]) == [4, 8] and (df["completed"][:2] == 6).all()
    assert any("stopped" in n for n in df.attrs["notes"])


def test_rate_sweep_marks_one_knee_and_a_pareto_front(target):
    from explorer.sweeps import serving as serving_sweep

    # one request at a time: at 1000 req/s requests queue behind each other, TTFT far past 2x
    df = serving_sweep.run(
        target,
        over="rate",
        values=[2, 8, 1000],
        engines=["sequential"],
        num_prompts=8,
        input_len=16,
        output_len=12,
        bar=False,
    )
    assert len(df) == 3 and df["knee"].sum() == 1 and df["pareto"].any()
    assert df.attrs["knee"]["sequential"] in (2, 8)
    assert df["median_ttft_ms"].iloc[-1] > 2 * df["median_ttft_ms"].iloc[0]
    assert list(df["offered_tok_s_modelled"]) == [24.0, 96.0, 12000.0]
    # (whether a higher rate buys throughput is a timing: `explorer sweep serving` prints it)


def test_knee_rule():
    import pandas as pd

    from explorer.sweeps.serving import mark

    df = pd.DataFrame(
        {
            "engine": ["c"] * 4,
            "over": ["rate"] * 4,
            "value": [1, 2, 4, 8],
            "median_ttft_ms": [10, 12, 19, 80],
            "output_throughput": [1, 2, 3, 3.5],
            "tok_s_per_user": [50, 49, 40, 10],
        }
    )
    mark(df)
    assert list(df["knee"]) == [False, False, True, False]
    assert list(df["pareto"]) == [True, True, True, True]
    df2 = df.assign(tok_s_per_user=[50, 49, 40, 39], output_throughput=[1, 2, 3, 2.9])
    mark(df2)
    assert list(df2["pareto"]) == [True, True, True, False]
    calm = df.assign(median_ttft_ms=[10, 11, 12, 19])  # never twice the lightest: no knee
    mark(calm)
    assert not calm["knee"].any()


# --- the CLI -------------------------------------------------------------------------------------


def test_cli_bench_serving_prints_vllms_table_and_writes_json(tmp_path, capsys):
    from explorer.cli import main

    out = tmp_path / "r.json"
    rc = main(
        [
            "bench",
            "serving",
            "--engine",
            "continuous",
            "--num-prompts",
            "4",
            "--input-len",
            "8",
            "--output-len",
            "6",
            "--goodput",
            "ttft:5000",
            "--json",
            str(out),
            "--compare",
            "sequential",
        ]
    )
    text = capsys.readouterr().out
    assert rc == 0
    for line in (
        "Serving Benchmark Result",
        "Successful requests:",
        "Output token throughput",
        "Median TTFT (ms):",
        "P99 ITL (ms):",
        "Request goodput (req/s):",
        "continuous/sequential throughput",
    ):
        assert line in text, line
    data = json.loads(out.read_text())
    assert data["completed"] == 4 and data["output_lens"] == [6, 6, 6, 6]


def test_cli_bad_input_is_one_line(tmp_path, capsys):
    from explorer.cli import main

    bad = tmp_path / "w.jsonl"
    bad.write_text('{"prompt": "x"}\n{oops\n')
    for argv, message in (
        (["--request-rate", "0"], "request rate must be > 0"),
        (["--max-concurrency", "0"], "max concurrency must be"),
        (["--workload", str(bad)], "line 2: not JSON"),
        (["--goodput", "ttft"], "needs a number"),
        (["--max-batch", "2"], "--max-batch is a knob of the static engine, not of sequential"),
        (["--compare", "static", "--max-batch", "0"], "static engine: max_batch (max batch) must"),
    ):
        rc = main(["bench", "serving", "--engine", "sequential", *argv])
        err = capsys.readouterr().err
        assert rc != 0 and message in err, (argv, err)
        assert "Traceback" not in err
