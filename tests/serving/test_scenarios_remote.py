"""Scenarios against a server, without one: the flags each server needs, the evidence a client sees
(hand-made records), and the scenarios that cannot run remotely. The run against a real
`transformers serve` is in test_serving_http.py (its server fixture)."""

from __future__ import annotations

import pytest

from explorer.serving import ServingResult
from explorer.serving.metrics import RequestRecord
from explorer.serving.scenarios import remote


def test_the_server_flags_come_from_the_scenarios_own_knobs():
    flags = remote.server_flags({"num_blocks": 6, "page_size": 16})
    assert flags["vLLM"].endswith("--num-gpu-blocks-override 6 --max-model-len 96 --block-size 16")
    assert "--max-total-tokens 96" in flags["SGLang"]  # SGLang counts tokens, not blocks
    assert flags["transformers serve"].endswith("--cb-num-blocks 6 --cb-block-size 16")
    chunk = remote.server_flags({"max_batch_tokens": 32}, {"num_blocks": 64, "page_size": 8})
    assert "--max-num-batched-tokens 32" in chunk["vLLM"] and "blocks" not in chunk["vLLM"]
    # transformers serve on a CPU needs its KV size said, from the run's whole knob set
    assert chunk["transformers serve"].endswith("--cb-max-batch-tokens 32 --cb-num-blocks 64 --cb-block-size 8")  # fmt: skip
    lacking = remote.server_flags({"max_requests_per_batch": 4})
    assert "(no flag for max_requests_per_batch=4)" in lacking["transformers serve"]


def test_only_scenarios_whose_knobs_live_in_a_server_run_remotely():
    names = remote.remote_names()
    assert {"kv-exhaustion", "head-of-line"} <= set(names)
    assert not {"overload", "memory-wall", "cold-start", "straggler"} & set(names)
    with pytest.raises(ValueError, match=r"overload scenario turns no engine knob.*--url takes"):
        remote.check_remote("overload")
    with pytest.raises(ValueError, match="unknown scenario 'nope'"):
        remote.check_remote("nope")


def _rec(i, sent, tokens, n_in=8, error=None):
    end = tokens[-1] if tokens else None
    return RequestRecord(f"r{i}", n_in, 4, sent, sent, sent, tokens, end, len(tokens), error=error)


def test_the_evidence_from_outside_counts_failures_stalls_and_the_long_prompts_effect():
    recs = [
        _rec(0, 0.0, [0.1, 0.2, 1.2, 1.3]),  # a 1 s gap while the long prompt is prefilled
        _rec(1, 0.0, [0.1, 0.2, 1.2, 1.3]),
        _rec(2, 0.0, [0.1, 0.2]),
        _rec(3, 0.25, [1.15, 1.2], n_in=400),  # the long prompt
        _rec(4, 0.3, [], error="HTTP 500"),
    ]
    res = ServingResult({"engine": "http"}, {}, recs, [], {"p99_itl_ms": 900.0}, {})
    ev = remote.outside_evidence(res)
    assert ev["requests"] == 5 and ev["failed"] == 1 and ev["first_error"] == "HTTP 500"
    assert ev["median_itl_ms"] == pytest.approx(100) and ev["stalls"] == 2
    assert ev["long_prompt_tokens"] == 400 and ev["long_ttft_ms"] == pytest.approx(900)
    # gaps ending after it was sent and starting before its first token: the two 1 s gaps
    assert ev["others_itl_during_long_prefill_ms"] == pytest.approx(1000)
    assert ev["others_itl_otherwise_ms"] == pytest.approx(100)
    line = remote.verdict_from_outside("head-of-line", ev, None)
    assert "1 of 5 requests failed" in line and "10.0x while the long prompt" in line
