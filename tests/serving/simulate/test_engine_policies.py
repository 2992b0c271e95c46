"""The served engines' schedulers (vLLM V1 and V0, SGLang, TensorRT-LLM) on tiny hand-made
states, the published runs' engine mapping, and the bad-input lines. No model, no chip: each
test builds the few requests it needs."""

from __future__ import annotations

import json

import pytest

from explorer.cli import main
from explorer.serving.simulate import published
from explorer.serving.simulate.engine_map import policy_of, run_setup
from explorer.serving.simulate.events import Simulator
from explorer.serving.simulate.policy import POLICIES, SimRequest, knobs_for, policy_for


class State:
    """The part of the event loop a policy reads: the waiting and running lists."""

    def __init__(self, running=(), waiting=()):
        self.running, self.waiting, self.now = list(running), list(waiting), 0.0


def decoding(rid: str, prompt: int = 32, tokens: int = 3, out: int = 64, page: int = 16):
    req = SimRequest(rid, prompt, out, 0.0)
    req.token_s = [0.0] * tokens
    req.cached = prompt + tokens - 1
    req.blocks = -(-req.cached // page)
    return req


def waiting(rid: str, prompt: int, out: int = 64) -> SimRequest:
    req = SimRequest(rid, prompt, out, 0.0)
    req.prefill_left = prompt
    return req


def make(engine: str, **knobs):
    return policy_for(engine, knobs_for(engine, knobs))


def rows_of(plan) -> list[tuple[str, int]]:
    return [(r.id, q) for r, q in plan.rows]


def land(plan):
    """What the event loop does when the plan's step ends: its tokens land."""
    for req, q in plan.rows:
        req.cached += q
        req.prefill_left = max(0, req.prefill_left - q)
        if req.prefill_left == 0:
            req.token_s.append(1.0)
    return plan


# --- vLLM V1 ------------------------------------------------------------------------------------


def test_vllm_runs_decodes_first_then_admits_waiting_in_order_chunking_the_last():
    pol = make("vllm", max_num_batched_tokens=150, num_gpu_blocks=100)
    sim = State(
        [decoding("d1"), decoding("d2"), decoding("d3")], [waiting("w1", 100), waiting("w2", 100)]
    )
    plan = pol.plan(sim)
    assert rows_of(plan) == [("d1", 1), ("d2", 1), ("d3", 1), ("w1", 100), ("w2", 47)]
    assert [r.id for r in sim.running] == ["d1", "d2", "d3", "w1", "w2"] and not sim.waiting


def test_vllm_without_chunked_prefill_or_past_max_num_seqs_leaves_prompts_waiting():
    sim = State([decoding("d1")], [waiting("w1", 100), waiting("w2", 100)])
    plan = make("vllm", max_num_batched_tokens=150, enable_chunked_prefill=False).plan(sim)
    assert rows_of(plan) == [("d1", 1), ("w1", 100)] and [r.id for r in sim.waiting] == ["w2"]
    sim = State([decoding("d1")], [waiting("w1", 10), waiting("w2", 10)])
    plan = make("vllm", max_num_seqs=2).plan(sim)
    assert rows_of(plan) == [("d1", 1), ("w1", 10)]


def test_vllm_preempts_the_newest_running_request_by_recompute_and_admits_no_one():
    # d1 needs a new block for its next token (32 cached = 2 full blocks); none is free
    old, new = decoding("d1", prompt=30, tokens=3), decoding("d2", prompt=14, tokens=2)
    sim = State([old, new], [waiting("w1", 4)])
    pol = make("vllm", num_gpu_blocks=old.blocks + new.blocks, enable_prefix_caching=False)
    plan = pol.plan(sim)
    assert rows_of(plan) == [("d1", 1)] and plan.preempted == 1
    assert [r.id for r in sim.waiting] == ["d2", "w1"]  # back at the front, none admitted
    assert new.blocks == 0 and new.prefill_left == 14 + 2 and new.preemptions == 1
    # with prefix caching (the default) its full blocks are found again: 16 of its 17 tokens
    old, new = decoding("d1", prompt=30, tokens=3), decoding("d2", prompt=16, tokens=2)
    sim = State([old, new], [])
    make("vllm", num_gpu_blocks=old.blocks + new.blocks).plan(sim)
    assert (new.cached, new.prefill_left, new.blocks) == (16, 16 + 2 - 16, 0)


# --- vLLM V0 with multi-step scheduling ---------------------------------------------------------


def test_vllm_v0_runs_a_prefill_only_step_before_decodes():
    pol = make("vllm-v0", max_num_batched_tokens=256)
    sim = State([decoding("d1")], [waiting("w1", 100), waiting("w2", 200)])
    assert rows_of(pol.plan(sim)) == [("w1", 100)]  # whole prompts only; w2 waits its turn
    assert rows_of(pol.plan(State([decoding("d1")], []))) == [("d1", 1)]


def test_vllm_v0_with_chunked_prefill_runs_decodes_first_then_chunks_waiting_prompts():
    pol = make("vllm-v0", max_num_batched_tokens=64, enable_chunked_prefill=True)
    sim = State([decoding("d1")], [waiting("w1", 40), waiting("w2", 200)])
    assert rows_of(pol.plan(sim)) == [("d1", 1), ("w1", 40), ("w2", 23)]  # w2 cut to the rest
    from types import SimpleNamespace

    long = [SimpleNamespace(id="long", prompt_ids=[0] * 10_000, max_tokens=8)]
    pol.check(long)  # a prompt past the budget is chunked, not refused
    with pytest.raises(ValueError, match="no chunked prefill"):
        make("vllm-v0", max_num_batched_tokens=64).check(long)


def test_a_v0_run_maps_chunked_prefill_and_its_frontend_from_its_flags_and_context():
    from explorer.serving.simulate.engine_map import V0_LONG_CONTEXT

    run = {"id": "x", "engine": "vLLM 0.6.3", "model": "arch:llama-3.1-8b", "settings": ""}
    run["settings"] = "--enable-chunked-prefill"  # (the model's context: S15's runs, above)
    _, knobs, what_if = run_setup(run)
    assert knobs["enable_chunked_prefill"] and what_if == {"sequence_overhead_s": 0.0}
    said = {**run, "settings": "--enable-chunked-prefill=False --disable-frontend-multiprocessing"}
    _, knobs, what_if = run_setup(said)
    assert not knobs["enable_chunked_prefill"] and "sequence_overhead_s" not in what_if
    short = {**run, "settings": "", "max_model_len": V0_LONG_CONTEXT}  # the model's own
    assert not run_setup(short)[1]["enable_chunked_prefill"]
    longer = {**run, "settings": f"--max-model-len {V0_LONG_CONTEXT + 1}"}
    assert run_setup(longer)[1]["enable_chunked_prefill"]


class Steps:
    """A step model of 1 ms per pass plus 1 us per query token."""

    gap_s = startup_s = 0.0

    def seconds(self, shape, passes) -> float:
        return 1e-3 + 1e-6 * sum(q for q, _ in passes)


def test_multi_step_scheduling_lands_tokens_in_bursts_of_n():
    reqs = [SimRequest("a", 8, 8, 0.0), SimRequest("b", 8, 4, 2e-3)]
    Simulator(make("vllm-v0", num_scheduler_steps=3), None, Steps()).run(reqs)
    a, b = reqs[0].token_s, reqs[1].token_s
    assert a[0] == pytest.approx(1e-3 + 8e-6)  # the prefill: one step, its token at once
    assert len(a) == 8 and a[1] == a[3] < a[4] == a[6] < a[7]  # then bursts of 3, 3 and 1
    assert a[1] == pytest.approx(a[0] + 3 * (1e-3 + 1e-6))  # a burst: 3 one-token steps
    # b arrived during a's first burst: its prefill waited for the burst's last step
    assert b[0] == pytest.approx(a[3] + 1e-3 + 8e-6) and len(b) == 4
    assert b[1:] == a[4:7] == [pytest.approx(b[0] + 3 * (1e-3 + 2e-6))] * 3  # decoding together


# --- SGLang -------------------------------------------------------------------------------------


def test_sglang_runs_a_prefill_batch_alone_whenever_waiting_requests_fit():
    pol = make("sglang", max_total_tokens=10_000)
    sim = State([decoding("d1")], [waiting("w1", 50), waiting("w2", 60)])
    assert rows_of(land(pol.plan(sim))) == [("w1", 50), ("w2", 60)]  # no decode rows in it
    assert rows_of(pol.plan(sim)) == [("d1", 1), ("w1", 1), ("w2", 1)]  # then decode


def test_sglang_chunks_a_long_prompt_and_reserves_outputs_conservatively():
    pol = make("sglang", chunked_prefill_size=64, max_total_tokens=10_000)
    sim = State([], [waiting("w1", 100), waiting("w2", 10)])
    assert rows_of(land(pol.plan(sim))) == [("w1", 64)]  # cut at the chunk; the rest next
    assert rows_of(pol.plan(sim)) == [("w1", 36), ("w2", 10)]
    # 1,000 slots: a running request with 900 tokens to go reserves 0.7 x 900 of them
    for conservativeness, first in ((1.0, "d1"), (0.5, "w1")):
        pol = make("sglang", max_total_tokens=1_000, schedule_conservativeness=conservativeness)
        sim = State([decoding("d1", prompt=10, tokens=1, out=901, page=1)], [waiting("w1", 300)])
        # 300 + 64 > 1,000 - 10 - 0.7 x 900 = 360; at half the conservativeness: 675 left
        assert rows_of(pol.plan(sim))[0][0] == first


# --- TensorRT-LLM -------------------------------------------------------------------------------


def test_trtllm_guaranteed_no_evict_admits_only_what_fits_whole():
    # 40 + 40 tokens in 16-token blocks: 5 blocks each, held from the start
    for blocks, admitted in ((10, ["w1", "w2"]), (9, ["w1"])):
        pol = make("trtllm", num_kv_blocks=blocks, tokens_per_block=16)
        sim = State([], [waiting("w1", 40, out=40), waiting("w2", 40, out=40)])
        assert [r.id for r, _ in pol.plan(sim).rows] == admitted
        assert [r.blocks for r in sim.running] == [5] * len(admitted)


def test_trtllm_mixes_decodes_with_contexts_under_max_num_tokens_without_chunking():
    pol = make("trtllm", max_num_tokens=100)
    sim = State([decoding("d1", page=32)], [waiting("w1", 60), waiting("w2", 60)])
    assert rows_of(pol.plan(sim)) == [("d1", 1), ("w1", 60)]  # w2 does not fit: waits
    pol = make("trtllm", max_num_tokens=100, enable_chunked_prefill=True)
    sim = State([decoding("d1", page=32)], [waiting("w1", 60), waiting("w2", 60)])
    assert rows_of(pol.plan(sim)) == [("d1", 1), ("w1", 60), ("w2", 39)]


# --- capacity on the class; the engine mapping; bad input ---------------------------------------


def test_each_policy_owns_its_capacity_formula():
    for name in POLICIES.names():
        assert "rate" in vars(POLICIES.get(name)), name
    same = {"num_gpu_blocks": 10_000, "max_num_seqs": 256, "max_num_batched_tokens": 2048}
    mixed = make("vllm", **same).rate(Steps(), None, 100, 50)
    split = make("vllm-v0", **same).rate(Steps(), None, 100, 50)
    # 20 prompts per prefill step; 256 decoding requests (max_num_seqs); 1 ms per step
    assert split == pytest.approx(1 / (3e-3 / 20 + 49 * (1e-3 + 256e-6) / 256))
    assert mixed > split  # prefills ride in decode steps instead of steps of their own


def test_every_published_run_maps_to_the_policy_of_its_engine_and_version():
    import re

    def expected(engine: str) -> str:
        if engine.startswith("TensorRT-LLM"):
            return "trtllm"
        if engine.startswith("SGLang"):
            return "sglang"
        found = re.match(r"vLLM (\d+)\.(\d+)", engine)
        if found is None:
            assert engine == "vLLM (CI build 9515)"  # the one run without a version: V1 assumed
            return "vllm"
        return "vllm-v0" if (int(found[1]), int(found[2])) < (0, 8) else "vllm"

    # vLLM 0.6 chunked its prefills where max_model_len > 32K and the run did not turn it off:
    # S13's H100 runs (--max-model-len 91680) and S15's (Llama-3.1-405B's 128K context)
    chunked_v0 = {"S13-405b-8xh100", "S15-405b-8xmi300x"}
    for p in published.load()["points"]:
        assert policy_of(p["engine"]) == expected(p["engine"]), p["id"]
        policy, knobs, _ = run_setup(p)
        if policy == "vllm-v0":
            chunked = knobs.pop("enable_chunked_prefill")
            assert chunked == any(p["id"].startswith(c) for c in chunked_v0), p["id"]
        if "--num-scheduler-steps 10" in (p.get("settings") or ""):
            assert knobs == {"num_scheduler_steps": 10}, p["id"]
        elif "--num-scheduler-step 15" in (p.get("settings") or ""):  # S13 on MI300X
            assert knobs == {} and not chunked, p["id"]  # (the flag's spelling is not read)
        elif policy == "trtllm" and p["workload"].get("input_len", 0) > 8192:  # 20,000 tokens
            assert knobs == {"enable_chunked_prefill": True}, p["id"]
        else:
            assert knobs == {}, p["id"]


@pytest.mark.parametrize(
    ("engine", "says"),
    [
        ("FooServe 1.2", "engine 'FooServe 1.2' has no policy in the what-if; it models vLLM"),
        ("vLLM", "engine 'vLLM' gives no version"),
        ("", "engine must name the serving engine and its version"),
    ],
)
def test_a_published_run_without_a_known_engine_or_version_is_one_line(tmp_path, engine, says):
    data = published.load()
    point = {**data["points"][0], "engine": engine}
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"sources": data["sources"], "points": [point]}))
    with pytest.raises(ValueError, match=says) as err:
        published.load(path)
    assert "\n" not in str(err.value)


def test_cli_names_the_engines_it_models_for_an_unknown_one(capsys):
    assert main(["simulate", "--engine", "nope", "--hardware", "h100"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("continuous, vllm, vllm-v0, sglang, trtllm") and "\n" not in err
    assert main(["simulate", "--engine", "sglang"]) == 2
    assert "give --hardware" in capsys.readouterr().err


# --- the report per source, engine and chip ------------------------------------------------------


def test_the_report_groups_errors_with_coverage_and_the_spread_of_repeated_runs():
    from explorer.serving.simulate.published_report import matching_row, report, report_text

    def row(pid, metric, err, **kw):
        base = {"id": pid, "source": "S1", "engine": "vLLM 0.6.0", "chip": "4x h100",
                "policy": "vllm-v0", "split": "held out", "metric": metric, "error_pct": err}  # fmt: skip
        return {**base, **kw}

    rows = [
        row("a", "median_ttft_ms", -10.0),
        row("b", "median_ttft_ms", 30.0),
        row("a", "median_tpot_ms", 4.0),
        row("c", "output_throughput", None, unsupported="does not fit"),
        row("d", "output_throughput", 20.0, source="S7", engine="TRT 1.0", policy="trtllm"),
    ]
    points = [{"id": "a", "measured": {"median_ttft_ms": 100.0},
               "repeats": [{"median_ttft_ms": 110.0}, {"median_ttft_ms": 90.0}]}]  # fmt: skip
    rep = report(rows, points)
    (s1, s7) = rep["source"]
    assert (s1["points"], s1["run"], s1["unsupported"]) == (3, 2, 1)
    assert s1["why_unsupported"] == ["does not fit"]
    assert s1["median_abs_error_pct"]["median_ttft_ms"] == 20.0 and s1["n"]["median_ttft_ms"] == 2
    assert s1["spread_pct"]["median_ttft_ms"] == pytest.approx(20.0)  # (110 - 90) / 100
    assert s7["median_abs_error_pct"]["output_throughput"] == 20.0
    assert matching_row(rep, "vllm-v0", "h100")["points"] == 3
    assert matching_row(rep, "sglang", "h100") is None
    text = report_text(rep)
    assert "per policy and chip:" in text and "unsupported: does not fit" in text
    assert "spread TTFT p50 20%" in text  # the spread, where a source repeated its runs


def test_the_capacity_search_sets_up_each_served_engine_from_the_chips_memory_plan():
    from explorer.model.loader import arch_info
    from explorer.serving.simulate.capacity import Setup

    info = arch_info("arch:llama-3.1-8b", "bfloat16")
    plain = Setup(info, "h100", 1, 512, 128)
    for engine, kv in (("vllm", "num_gpu_blocks"), ("sglang", "max_total_tokens"),
                       ("trtllm", "num_kv_blocks")):  # fmt: skip
        setup = Setup(info, "h100", 1, 512, 128, engine=engine)
        assert setup.engine == engine and setup.knobs[kv] > 0 and setup.capacity > 0
    sglang = Setup(info, "h100", 1, 512, 128, engine="sglang")
    assert sglang.knobs["max_total_tokens"] == plain.extra["memory"]["kv_tokens"]
    a100 = Setup(info, "a100", 1, 512, 128, engine="vllm").knobs  # vLLM's smaller-GPU defaults
    assert (a100["max_num_batched_tokens"], a100["max_num_seqs"]) == (2048, 256)


def test_a_request_the_kv_cache_can_never_hold_is_refused_before_the_run():
    from explorer.serving.workload import Request

    big = [Request("r0", [1] * 60, 8, 0.0)]  # 68 tokens: 5 blocks of 16
    for engine, knobs in (("vllm", {"num_gpu_blocks": 4}), ("vllm-v0", {"num_gpu_blocks": 4}),
                          ("trtllm", {"num_kv_blocks": 2}), ("sglang", {"max_total_tokens": 64})):  # fmt: skip
        with pytest.raises(ValueError, match="request r0") as err:
            make(engine, **knobs).check(big)
        assert "\n" not in str(err.value)
