"""Failure scenarios: the registry, evidence and verdicts computed from hand-made runs, two real
scenarios end to end at tiny size, and the bad-input lines. No timing is asserted."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from explorer.cli import main
from explorer.serving import scenarios
from explorer.serving.engines import Iteration
from explorer.serving.metrics import RequestRecord, summarise
from explorer.serving.run import ServingResult
from explorer.serving.scenarios import (
    cold_start,
    head_of_line,
    kv_exhaustion,
    memory_wall,
    overload,
)

NAMES = ("overload", "kv-exhaustion", "head-of-line", "straggler", "memory-wall", "cold-start")


@pytest.fixture
def one_thread():
    """One torch thread: the runs keep their order on a shared machine (nothing is timed)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def rec(i, arrival, tokens, input_len=4, sent=None):
    """A finished request whose tokens came at these times."""
    r = RequestRecord(f"req-{i}", input_len, len(tokens), arrival)
    r.sent_s = arrival if sent is None else sent
    r.start_s = r.sent_s
    r.token_s, r.end_s, r.output_len = list(tokens), tokens[-1], len(tokens)
    return r


def result(records, iterations=(), engine=None, workload=None):
    return ServingResult(
        engine or {"engine": "continuous"},
        workload or {"num_prompts": len(records)},
        list(records),
        list(iterations),
        summarise(list(records)),
        {"partial": False},
    )


def it(index, decode=0, prefill=0, prefill_tokens=0, preempted=0, rows=None, seconds=0.01):
    return Iteration(
        index,
        index * seconds,
        (index + 1) * seconds,
        decode,
        prefill,
        prefill_tokens,
        decode + prefill_tokens,
        preempted=preempted,
        passes=rows,
    )


# --- the registry -------------------------------------------------------------------------------


def test_registry_lists_every_scenario_with_its_knobs_and_why():
    assert scenarios.names() == NAMES
    for name in NAMES:
        sc = scenarios.get(name)
        assert sc.why.count(". ") >= 2, name  # three sentences
        for knob in sc.needs:  # each knob it turns is one its engine has
            assert scenarios.engine_takes(sc.engine, knob), (name, knob)
    assert scenarios.get("kv-exhaustion").needs == ("num_blocks",)
    rows = {row["name"]: row for row in scenarios.catalog()}
    assert rows["memory-wall"]["takes_budget"] and not rows["cold-start"]["model_ok"]
    assert rows["straggler"]["engine"] == "static" and rows["straggler"]["needs"] == ["max_batch"]


def test_unknown_scenario_lists_them():
    with pytest.raises(ValueError, match="unknown scenario 'nope'; the scenarios are overload"):
        scenarios.get("nope")


def test_an_engine_without_the_knob_says_which_engine_has_it():
    with pytest.raises(ValueError) as err:
        scenarios.check_engine("kv-exhaustion", "static")
    assert str(err.value) == (
        "the kv-exhaustion scenario needs the continuous engine's num_blocks; "
        "the static engine has no num_blocks"
    )
    scenarios.check_engine("overload", "static")  # overload turns no knob: any engine


# --- evidence and verdicts from hand-made runs ---------------------------------------------------


def test_kv_evidence_counts_preemptions_and_recomputed_work():
    sc = scenarios.get("kv-exhaustion")
    recs = [rec(i, 0.0, [0.1, 0.2, 0.3 + 2.0 * (i == 0)], input_len=8) for i in range(3)]
    its = [
        it(0, prefill=3, prefill_tokens=24),
        it(1, decode=2, preempted=1),
        it(2, prefill=1, prefill_tokens=9),
        it(3, decode=3),
    ]
    broken = result(recs, its, {"engine": "continuous", "num_blocks": 2})
    healthy = [rec(i, 0.0, [0.1, 0.2, 0.3], input_len=8) for i in range(3)]
    fixed = result(
        healthy,
        [it(0, prefill=3, prefill_tokens=24), it(1, decode=3)],
        {"engine": "continuous", "num_blocks": 8},
    )
    ev = sc.evidence(broken, fixed, {})
    assert ev["broken"]["preemptions"] == 1 and ev["fixed"]["preemptions"] == 0
    assert ev["broken"]["recomputed_tokens"] == 9  # 33 prefilled - 3 prompts of 8
    assert ev["recomputed_share"] == pytest.approx(9 / 33)
    assert ev["broken"]["max_itl_ms"] == pytest.approx(2100)
    assert ev["p99_itl_ratio"] > 1
    v = sc.verdict(ev)
    assert v.startswith("1 preemptions with 2 KV blocks, 0 with 8; 27% of the prefill work")


def test_overload_evidence_judges_a_growing_queue_unstable():
    sc = scenarios.get("overload")
    # 40 arrivals every 0.1 s, served one per 0.2 s: the queue grows by half an arrival each
    grow = [rec(i, 0.1 * i, [0.2 * (i + 1), 0.2 * (i + 1) + 0.01]) for i in range(40)]
    keep = [rec(i, 0.1 * i, [0.1 * i + 0.05, 0.1 * i + 0.06]) for i in range(40)]
    ev = sc.evidence(result(grow), result(keep), {"capacity_rps": 5.0})
    assert ev["steady"] is False and ev["fixed_steady"] is True
    assert ev["queue_growth"] == pytest.approx(0.5, abs=0.05)
    assert ev["ttft_climb"] > 5  # the last quarter waits far longer than the first
    assert ev["short_run_requests"] == overload.SHORT
    assert sc.verdict(ev).startswith(f"unstable at {overload.OVERLOAD}x capacity")


def test_replicas_are_enough_for_each_to_see_at_most_the_target_load():
    assert overload.replicas_needed(30.0, 10.0, 0.5) == 6  # 3x capacity, each at 0.5
    assert overload.replicas_needed(31.0, 10.0, 0.5) == 7
    assert overload.replicas_needed(1.0, 10.0, 0.5) == 1


def test_every_scenario_has_the_same_sizes_at_every_scale():
    for name in NAMES:
        presets = scenarios.get(name).presets()
        assert set(presets) >= {*scenarios.SCALES, "modelled"}, name
        assert len({tuple(sorted(p)) for p in presets.values()}) == 1, name  # the same keys


def test_head_of_line_evidence_separates_the_long_prompt():
    sc = scenarios.get("head-of-line")
    shorts = [rec(i, 0.0, [0.1, 0.2, 1.2, 1.3]) for i in range(3)]
    long = rec(9, 0.15, [1.2], input_len=100)
    long.id = head_of_line.LONG_ID
    broken = result(
        [*shorts, long],
        [it(0, decode=3, prefill_tokens=100, seconds=1.0)],
        {"engine": "continuous", "max_batch_tokens": 200},
    )
    fixed_shorts = [rec(i, 0.0, [0.1, 0.2, 0.3, 0.4]) for i in range(3)]
    late = rec(9, 0.15, [1.5], input_len=100)
    late.id = head_of_line.LONG_ID
    fixed = result(
        [*fixed_shorts, late],
        [it(0, prefill_tokens=20)],
        {"engine": "continuous", "max_batch_tokens": 20},
    )
    ev = sc.evidence(broken, fixed, {"long_at": 0.15})
    assert ev["broken"]["decodes_in_largest_prefill"] == 3
    assert ev["broken"]["others_max_itl_ms"] == pytest.approx(1000)
    assert ev["fixed"]["others_max_itl_ms"] == pytest.approx(100)
    assert ev["broken"]["largest_prefill_tokens"] == 100 and ev["long_len"] == 100
    assert ev["long_ttft_ratio"] == pytest.approx(1.35 / 1.05)
    assert "100-token prompt prefilled in one pass" in sc.verdict(ev)


def test_slot_utilisation_of_a_static_batch_waiting_for_its_straggler():
    sc = scenarios.get("straggler")
    # a batch of 4 slots: 4 rows decode, then 1, 1, 1 (the straggler)
    static_its = [it(0, prefill=4, prefill_tokens=16)] + [
        it(i, decode=d) for i, d in enumerate((4, 1, 1, 1), 1)
    ]
    recs = [rec(i, 0.0, [0.1, 0.2]) for i in range(4)]
    broken = result(recs, static_its, {"engine": "static", "max_batch": 4})
    fixed = result(
        recs,
        [it(0, decode=4), it(1, decode=3, prefill=1)],
        {"engine": "continuous", "max_requests_per_batch": 4},
    )
    ev = sc.evidence(broken, fixed, {})
    assert ev["broken"]["slot_utilisation"] == pytest.approx(7 / 16)
    assert ev["fixed"]["slot_utilisation"] == pytest.approx(1.0)
    assert "kept 44% of their slots busy" in sc.verdict(ev)


def test_cold_start_puts_the_load_on_the_clock():
    recs = [rec(0, 0.0, [0.05, 0.06]), rec(1, 0.0, [0.05, 0.07]), rec(2, 0.3, [0.35, 0.36])]
    res = result(recs, [it(0)])
    out = cold_start.delayed(res, {"req-0": 0.0, "req-1": 0.1, "req-2": 0.5}, load_s=0.2)
    r0, r1, r2 = out.records
    assert (r0.sent_s, r1.sent_s) == (0.0, 0.1)  # arrived during the load: waited from arrival
    assert r0.ttft == pytest.approx(0.25) and r1.ttft == pytest.approx(0.15)
    assert r2.sent_s == pytest.approx(0.5) and r2.ttft == pytest.approx(0.05)
    assert out.iterations[0].start_s == pytest.approx(0.2)


def test_memory_wall_prediction_is_the_cost_model():
    info = SimpleNamespace(kv_bytes_per_token=1000, vocab_size=10)
    s = {"input_len": 12, "output_len": 4, "page_size": 8, "max_batch_tokens": 5}
    # 2 blocks of 8 tokens per request, 2 spare blocks: (2b + 2) x 8,000 bytes
    assert memory_wall.cache_bytes(3, info, s) == 64_000
    assert memory_wall.predicted_failing_batch(64_000, info, s) == 4
    assert memory_wall.predicted_failing_batch(63_999, info, s) == 3


@pytest.mark.parametrize("predicted", [1, 3, 7, 10, 20])
def test_the_wall_is_found_from_either_side_of_the_prediction(predicted):
    tried = []

    def fits(batch):
        tried.append(batch)
        return batch < 7

    assert memory_wall.find_wall(fits, predicted) == (6, 7)
    assert len(tried) == len(set(tried))  # no batch served twice
    assert memory_wall.find_wall(lambda b: True, 5) == (
        max(b for b in range(5, 21) if b - 5 in (0, 1, 3, 7, 15)),
        None,
    )


# --- real scenarios end to end at tiny size --------------------------------------------------------


def test_kv_exhaustion_end_to_end(target, one_thread):
    res = scenarios.run("kv-exhaustion", target, scale="small", sizes={"output_len": 12})
    d = res.to_dict()
    small = kv_exhaustion.SMALL
    assert res.broken.workload["num_prompts"] == small["num_prompts"]  # the small preset
    assert res.broken.workload["output_len"] == 12  # with sizes over it
    assert set(d) >= {"scenario", "broken", "fixed", "verdict", "why", "evidence", "modelled"}
    assert d["broken"]["preemptions"] > 0 and d["fixed"]["preemptions"] == 0
    assert d["broken"]["steady"] is None  # a burst has no rate to be steady at
    assert res.evidence["broken"]["recomputed_tokens"] > 0
    assert not res.partial and not res.modelled
    # an evicted request keeps the times of the tokens it had before it was reset
    assert all(len(r.token_s) == r.output_len for r in res.broken.records)


def test_memory_wall_fails_inside_the_budget_and_this_process_lives():
    """From a fresh process, as `explorer scenario` runs it: a long-lived process (this pytest
    worker, after hundreds of tests) holds freed memory a forked child may get back on top of
    its budget (the verdict then says so)."""
    import json
    import os
    import subprocess
    import sys

    argv = ["scenario", "memory-wall", "--scale", "small", "--memory-budget", "0.004", "--json"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "explorer.cli", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]  # the failure was caught: the process lived
    out = json.loads(run.stdout)
    ev = out["evidence"]
    assert ev["predicted_batch"] >= 2 and ev["failed_batch"] is not None, out["verdict"]
    assert ev["fitted_batch"] == ev["failed_batch"] - 1
    broken, fixed = out["broken"], out["fixed"]
    assert broken["out_of_memory"] and all(r["error"] for r in broken["requests"])
    assert not any(r["error"] for r in fixed["requests"])
    assert "memory" in ev["error"]


def test_a_stop_keeps_the_cut_run_marked_partial(target):
    stop = threading.Event()
    res = scenarios.run(
        "kv-exhaustion", target, stop=stop, progress=lambda text: stop.set(), scale="small"
    )
    assert res.partial and res.fixed is None and res.broken.meta["partial"]
    assert res.verdict.startswith("stopped during the broken run")
    assert res.to_dict()["partial"] is True


# --- bad input: one line, exit status 2 ---------------------------------------------------------


@pytest.mark.parametrize(
    "argv, line",
    [
        (["scenario", "nope"], "unknown scenario 'nope'; the scenarios are overload"),
        (["scenario", "memory-wall", "--memory-budget", "1e9"], "more than this machine has"),
        (["scenario", "kv-exhaustion", "--engine", "static"], "needs the continuous engine's"),
        (["scenario", "cold-start", "--hardware", "h100"], "has no model in the simulator"),
        (["scenario", "overload", "--memory-budget", "1"], "has no memory budget"),
        (["scenario", "memory-wall", "--memory-budget", "-1"], "must be a number of GB > 0"),
    ],
)
def test_bad_input_is_one_line(capsys, argv, line):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and line in err


def test_an_unknown_scale_or_size_is_one_line():
    with pytest.raises(ValueError, match="scale must be one of small, default, got 'huge'"):
        scenarios.run("overload", None, scale="huge")
    with pytest.raises(ValueError) as err:
        scenarios.run("kv-exhaustion", None, sizes={"prompts": 4})
    assert str(err.value) == (
        "sizes: the kv-exhaustion scenario has no size 'prompts'; "
        "it has num_prompts, input_len, output_len, page_size"
    )


def test_list(capsys):
    assert main(["scenario", "--list"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()] == list(NAMES)


def test_the_cli_runs_a_scenario_at_the_small_scale(capsys):
    import json

    assert main(["scenario", "straggler", "--scale", "small", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    small = scenarios.get("straggler").presets()["small"]
    assert out["scenario"] == "straggler" and out["verdict"]
    assert out["broken"]["num_prompts"] == out["fixed"]["num_prompts"] == small["num_prompts"]
    assert main(["scenario", "straggler", "--scale", "huge"]) == 2  # the choices: the presets
    assert "small" in capsys.readouterr().err


def test_memory_wall_probes_from_a_fresh_server_whatever_this_process_did(target):
    """In this long-lived pytest worker (the heap history that let batches past the budget when
    the probes forked from here): the probes fork from a freshly spawned server instead."""
    import numpy as np

    junk = [np.ones(1 << 18) for _ in range(200)]  # ~400 MB allocated and freed: a used heap
    del junk
    res = scenarios.run("memory-wall", target, scale="small", memory_budget_gb=0.004)
    ev = res.evidence
    assert ev["failed_batch"] is not None, res.verdict
    assert ev["fitted_batch"] == ev["failed_batch"] - 1
    assert all(r.error for r in res.broken.records) and "memory" in ev["error"] and not res.partial
