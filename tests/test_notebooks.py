"""The classroom notebooks: each runs top to bottom in a fresh kernel and still teaches its point.

Every numbered notebook collects the numbers it measured or modelled in a dict named `facts`. The
test appends one cell that prints them as `NOTEBOOK_FACTS {json}` (the notebook itself never shows
them to a student), and the checks below assert the facts each notebook teaches, so a notebook that
runs but stops showing its point fails. The checks are about facts that hold on any machine: counts,
bytes, equality, ratios of modelled quantities, the regime the cost model assigns and bounds a
measurement may never beat. Never a timing ("faster than", a speedup above 1): those depend on the
machine and its load, and the notebooks print them without asserting them.

Knobs (environment variables):
    EXPLORER_NOTEBOOK_PARAMS   JSON dict of parameter overrides, injected after the cell tagged
                               `parameters` (papermill style). Keys whose value is a dict apply only
                               to notebooks whose name starts with the key, e.g.
                               '{"DEVICE": "cuda", "04": {"MODEL": "arch:qwen2.5-0.5b"}}'.
                               CI_SCALE below is applied first: a notebook whose defaults teach at a
                               larger scale runs at its CI scale here (each notebook <= 60 s).
    EXPLORER_NOTEBOOK_TIMEOUT  seconds allowed per cell (default 300).
    EXPLORER_NOTEBOOK_THREADS  OMP/MKL threads for the kernel (default 1). On a shared CPU, torch's
                               default of one thread per core oversubscribes and runs ~10x slower.
    EXPLORER_NOTEBOOK_BUSY     N: run N busy-loop processes beside every notebook (default 0). With 2
                               on a 2-core machine this reproduced the missed-reply wait on demand
                               (tests/notebook_runner.py); the timing line then shows max reply lag.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path

import nbformat
import pytest

from explorer.costs.speculation import expected_speedup

ROOT = Path(__file__).resolve().parent.parent
NB_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NB_DIR.glob("[0-9][0-9]_*.ipynb"))
MARKER = "NOTEBOOK_FACTS"
# appended by the test only: what the tests read, out of the student's view
FACTS_CELL = f"import json as _json\n\nprint({MARKER!r}, _json.dumps(facts, default=float))"
BUNDLED = (ROOT / "assets" / "models" / "target" / "config.json").exists() and (
    ROOT / "assets" / "models" / "draft" / "config.json"
).exists()


def _ids(paths):
    return [p.stem for p in paths]


def _params_cell(nb) -> int:
    for i, cell in enumerate(nb.cells):
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            return i
    raise AssertionError("no cell tagged 'parameters'")


# The scale CI runs a notebook at where its defaults teach at a larger one (the notebook says which).
CI_SCALE = {
    # 128 tokens with the cache and without (the uncached half is quadratic: 256 took ~4x as long)
    "03": {"NEW_TOKENS": 128},
    # batches up to 32 (64 and 128 took most of the sweep's time; the knee is modelled, found by
    # decode_knee whatever batches are measured, and the facts read batches 1 and 8)
    "06": {"BATCHES": (1, 2, 4, 8, 16, 32)},
    # 16 requests, and the rate sweep's two ends (4 values took ~12 s of its ~40 s in CI)
    "08": {"REQUESTS": 16, "RATES": (4, 256)},
    # the rungs the facts read (compile once, not twice; no slow torchao int8 on CPU), and for the
    # memory-bound shape only the int8 rung beside eager, on SmolLM2-135M's shape instead of the
    # 0.5B one (its load, int8 packing and passes took 18 s of the notebook's ~52 s; 135M: 5 s;
    # both read ~1/4 of the fp32 bytes and ran 4.0-4.5x faster in int8 here)
    "10": {
        "MODEL": "arch:smollm2-135m",
        "SMALL_RUNGS": [
            "static",
            "static+compile",
            "bf16",
            "int8:fbgemm",
            "int4",
            "prompt lookup",
            "prefix cache",
        ],
        "BIG_RUNGS": ["int8:fbgemm"],
    },
    # one 500-request check seed, a stale profile warned, not refitted (the curves keep their 400
    # requests: at 200 all of a run fits one H100's batch of 256 and no point past capacity reads
    # unstable)
    "11": {"CHECK": 500, "SEEDS": [0], "REFIT_STALE": False},
    # two values per axis, three repeats; the 0.5B shape (section 2b) only outside CI: its load
    # alone takes 30 s or more on a busy 2-core machine
    "12": {
        "LENGTHS": [8, 256],
        "PREFILLS": [1, 64],
        "BATCHES": [1, 8],
        "SPREADS": [0.0, 1.0],
        "NUM_PROMPTS": 4,
        "BIG_MODEL": None,
        "MAP_BATCHES": [1, 16],
        "MAP_CONTEXTS": [32, 448],
        "MAP_MEASURED": [(1, 448), (16, 32)],  # a long prefill per arm costs seconds
        "PAPER_BATCHES": [1, 256],
        "PAPER_CONTEXTS": [256, 4096],
    },
}


def _overrides(stem: str) -> dict:
    raw = json.loads(os.environ.get("EXPLORER_NOTEBOOK_PARAMS", "{}") or "{}")
    out = dict(CI_SCALE.get(stem[:2], {}))
    out.update({k: v for k, v in raw.items() if not isinstance(v, dict)})
    for prefix, sub in raw.items():
        if isinstance(sub, dict) and stem.startswith(prefix):
            out.update(sub)
    return out


def _needs_bundled(nb, overrides: dict) -> bool:
    """True when a parameter names a bundled model and no override replaces it."""
    params = nb.cells[_params_cell(nb)].source
    names = re.findall(r'^(\w+)\s*=\s*["\']bundled:', params, flags=re.M)
    return any(name not in overrides for name in names)


def execute(path: Path) -> tuple[dict, float, object]:
    """Run the notebook in a fresh kernel (raises on any cell error); return (facts, seconds, notebook).

    tests/notebook_runner.py says why this is not plain nbclient (a missed wake-up made cells wait
    out their whole timeout, then pass); a cell that really hangs raises NotebookCellTimeout.

    The notebook's metadata gets "explorer_cell_seconds": {cell index: [seconds to send, seconds to the
    reply]} and "explorer_phases" (kernel start, cells, shutdown), to tell a slow cell from a slow kernel.
    """
    from notebook_runner import NotebookRunner

    nb = nbformat.read(path, as_version=4)
    overrides = _overrides(path.stem)
    if overrides:
        lines = ["# injected by tests/test_notebooks.py (EXPLORER_NOTEBOOK_PARAMS)"]
        lines += [f"{k} = {v!r}" for k, v in overrides.items()]
        nb.cells.insert(_params_cell(nb) + 1, nbformat.v4.new_code_cell("\n".join(lines)))
    nb.cells.append(nbformat.v4.new_code_cell(FACTS_CELL))
    threads = os.environ.get("EXPLORER_NOTEBOOK_THREADS", "1")
    env = {
        **os.environ,
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "TOKENIZERS_PARALLELISM": "false",
        "PLOTLY_RENDERER": "plotly_mimetype",
    }
    client = NotebookRunner(
        nb,
        name=path.name,
        timeout=int(os.environ.get("EXPLORER_NOTEBOOK_TIMEOUT", "300")),
        kernel_name="python3",
        allow_errors=False,
        resources={"metadata": {"path": str(NB_DIR)}},
    )
    marks: dict = {}
    now = time.perf_counter

    def mark(what):
        return lambda cell=None, cell_index=None, **_: marks.setdefault(cell_index, {}).__setitem__(
            what, now()
        )

    client.on_cell_start, client.on_cell_complete, client.on_cell_executed = (
        mark("start"),
        mark("sent"),
        mark("done"),
    )
    client.on_notebook_start = lambda **_: marks.__setitem__("kernel_ready", now())
    client.on_notebook_complete = lambda **_: marks.__setitem__("shut_down", now())
    t0 = now()
    try:
        client.execute(env=env)  # a fresh kernel; CellExecutionError on the first failing cell
    finally:
        cells = {i: m for i, m in marks.items() if isinstance(i, int) and "sent" in m}  # code cells
        nb.metadata["explorer_cell_seconds"] = {
            i: [
                round(m.get("sent", m["start"]) - m["start"], 3),
                round(m.get("done", now()) - m["start"], 3),
            ]
            for i, m in cells.items()
        }
        last = max((m.get("done", 0) for m in cells.values()), default=t0)
        nb.metadata["explorer_phases"] = {
            "kernel_start": round(marks.get("kernel_ready", t0) - t0, 2),
            "cells": round(last - marks.get("kernel_ready", t0), 2),
            "shutdown": round(marks.get("shut_down", now()) - last, 2),
        }
        lags = [lag for lag in client.reply_lags.values() if lag is not None]
        nb.metadata["explorer_max_reply_lag_s"] = round(max(lags), 3) if lags else None
    return read_facts(nb), now() - t0, nb


def read_facts(nb) -> dict:
    for cell in reversed(nb.cells):
        for out in cell.get("outputs", []):
            text = out.get("text", "") if out.get("output_type") == "stream" else ""
            for line in text.splitlines():
                if line.startswith(MARKER + " "):
                    return json.loads(line[len(MARKER) + 1 :])
    raise AssertionError(f"the notebook printed no '{MARKER} {{...}}' line")


# --- what each notebook teaches ----------------------------------------------------------------


def check_01(f: dict) -> None:
    # asked for every row: one row of V logits per position
    assert f["logits_shape"] == [1, f["T"], f["V"]]
    assert f["last_only_shape"] == [1, 1, f["V"]]  # what an engine computes: the last row only
    assert abs(f["prob_sum"] - 1) < 1e-4  # softmax gives a distribution
    # Session = that pass
    assert f["session_top_id"] == f["our_top_id"] and f["session_vs_softmax"] < 1e-5
    assert f["entropy_nats"] > 0


def check_02(f: dict) -> None:
    H = list(f["entropy_by_temperature"].values())  # temperatures in increasing order
    assert all(a < b for a, b in zip(H, H[1:])), "a higher temperature flattens the distribution"
    # top-k keeps exactly k (no ties in float logits of a trained model)
    assert f["top_k_kept"] == 50
    assert f["top_p_mass"] >= 0.9 - 1e-6 > f["top_p_mass_one_fewer"]  # the smallest set reaching p
    # temperature runs first: a hot one widens the nucleus
    assert f["top_p_kept_hot"] > f["top_p_kept_cold"]
    assert abs(f["final_sum"] - 1) < 1e-4
    assert f["penalised_tokens"] <= f["context_tokens"]
    assert f["draw_tv"] < 0.08, "draw frequencies match the final probabilities"


def check_03(f: dict) -> None:
    assert f["tokens_equal"]  # the cache changes the work, not the tokens
    # with the cache a decode pass feeds 1 token
    assert f["fed_on"][1:] == [1] * (len(f["fed_on"]) - 1)
    # without: everything
    assert f["fed_off"] == list(range(f["prompt_len"], f["prompt_len"] + len(f["fed_off"])))
    # modelled: without the cache per-pass FLOPs grow with the length (a quadratic total) ...
    assert (
        f["per_step_flops_off_last"] > 10 * f["per_step_flops_off_first"]
        and f["flops_off"] > 10 * f["flops_on"]
    )
    per_token = 2 * f["kv_layers"] * f["kv_heads"] * f["head_dim"] * f["bytes_per_value"]
    # ... with it, a pass reads one more token's keys and values than the pass before (cell 6)
    growth = f["bytes_on_last"] - f["bytes_on_first"]
    assert growth == pytest.approx(per_token * (f["new_tokens"] - 2), rel=1e-9)
    assert f["kv_bytes_per_token"] == per_token and f["kv_growth_per_step"] == [per_token]
    assert f["kv_measured"] == f["kv_predicted"] == per_token * f["kv_positions"]
    heads, kv, kib = f["gqa"]["llama-3.1-8b"]
    # 2 x 32 layers x 8 x 128 x 2 bytes = 128 KiB per token
    assert (heads, kv, kib) == (32, 8, 128.0)


def check_04(f: dict) -> None:
    assert f["weights_share"] > 0.95  # decode at batch 1 moves the weights, almost nothing else
    # left of the ridge point: the balance is this machine's measured FLOP rate over its measured
    # bandwidth, and other work lowers the first more (1.47 FLOP/byte in a loaded CI run, where
    # "a quarter of it" read 0.37 against the step's 0.50)
    assert f["intensity"] < f["balance"]
    assert f["decode_bounds"] == ["memory"]
    # a bound, not a timing: no step may beat the roofline's lower bound (else the model is wrong)
    assert f["latency_median_s"] >= f["bound_median_s"]


def check_05(f: dict) -> None:
    assert f["prefill_bounds"][-1] == "compute" and set(f["decode_bounds"]) == {"memory"}
    assert min(f["prefill_intensity"][-1:]) > f["balance"] > max(f["decode_intensity"])
    # the answer, modelled: TTFT of P tokens costs ~P / (2 x balance) decode passes in fp32, << P
    assert 1 < f["bound_ratio"] < f["P"] / 4
    assert f["bound_ratio"] == pytest.approx(f["ttft_over_tpot_predicted"], rel=0.5)


def check_06(f: dict) -> None:
    # intensity grows with the batch (modelled)
    assert all(a <= b for a, b in zip(f["intensity"], f["intensity"][1:]))
    assert f["bounds"][0] == "memory" and f["knee"] is not None and f["knee"] > 1
    # the answer, modelled: one batch-8 step costs far less than 8 batch-1 steps
    assert 1 <= f["bound_ratio_8"] < 8


def check_07(f: dict) -> None:
    # speculative greedy output == target greedy output (exact in fp32; see the notebook for bf16)
    assert f["greedy_equal"] or f["dtype"] != "float32"
    assert f["greedy_rounds"] <= f["greedy_tokens"]  # never more target passes than tokens
    assert 0 <= f["alpha_greedy"] <= 1 and f["tokens_per_round_greedy"] >= 1
    assert f["tv_spec"] < 2.5 * f["tv_noise_expected"] + 0.02, (
        "speculative samples follow the target's p"
    )
    # the figures the text quotes (alpha 0.7, k 4, c 0.1), from the modelled formulas
    assert round(f["example_tokens_per_round"], 1) == 2.8 and round(f["example_speedup"]) == 2


def check_08(f: dict) -> None:
    assert all(n == f["requests"] for n in f["completed"].values()), "every engine serves them all"
    assert all(lens == [f["output"]] * f["requests"] for lens in f["output_lens"].values())
    assert f["rate_completed"] == [f["requests"]] * len(f["rates"]), "every rate serves them all"
    assert f["knee"] is None or f["knee"] in f["rates"]
    assert f["long_len"] > 200 and f["stalled_gaps"] > 0  # gaps that overlapped the long prefill


def check_09(f: dict) -> None:
    assert f["regimes"] == {
        "A: small decode": "overhead",
        "B: 0.5B decode": "memory",
        "C: 0.5B prefill": "compute",
    }, f["regimes"]
    assert f["split_sums"] == pytest.approx(
        [1.0, 1.0, 1.0], rel=1e-9
    )  # floors + overhead = latency
    assert all(0 < u <= 1 for u in f["mbu"] + f["mfu"])
    assert "overhead" in f["map_regimes"]
    assert f["heldout_after"] < f["heldout_before"], "calibration predicts held-out steps better"
    assert f["lens_last_vs_step"] < 1e-4  # the lens at the last layer is the model's output
    assert f["attention_row_sums"] == pytest.approx([1.0] * len(f["attention_row_sums"]), abs=1e-4)
    # the answer's arithmetic: P / 2 FLOPs per weight byte in fp32 for the layers; the output head,
    # read in full for the last position only, pulls the whole pass below that
    assert f["prefill"] / 4 < f["prefill_flops_per_byte"] <= f["prefill"] / 2


def check_10(f: dict) -> None:
    assert f["int8_bytes_ratio_big"] < 0.3 and f["int8_bytes_ratio_small"] < 0.35, (
        "~1/4 the weights"
    )
    assert f["compile_s"] is not None and f["compile_s"] > 0, "compile time reported apart"
    assert f["static_greedy_equal"] and f["lookup_greedy_equal"], "lossless rungs are lossless"
    assert abs(f["ppl_int8"] / f["ppl_fp32"] - 1) < 0.02, "int8 costs < 2% perplexity"
    assert all(p is None or p != p for p in f["big_perplexity"]), "no perplexity for random weights"
    assert f["step_weights"][0] == "fp32" and f["step_weights"][1].startswith("int8")
    assert f["int4_skipped"] is None or "int4" in f["int4_skipped"]
    assert "static+compile" not in f["big_rungs"], (
        "the text says compile was not run on the 0.5B shape"
    )


def check_11(f: dict) -> None:
    e = f["errors"]
    assert f["simulated_modelled"] and f["same_keys"], "a simulated run is the serving lab's result"
    # the errors are timings of this machine: the notebook prints them, the benchmark
    # (explorer simulate --validate) holds them to targets; CI checks they were measured, and that
    # fidelity is judged on the latencies (an open-loop run's throughput matches any engine)
    assert math.isfinite(f["step_heldout_err_pct"]), "the fit's held-out error is reported"
    assert set(e) == {"median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms"}, e
    assert all(math.isfinite(v) for v in e.values()), e
    mc = f["machine_check"]  # one fresh measurement against the fit it reuses; stale -> refitted
    assert mc["ratio"] > 0 and math.isfinite(mc["ratio"]), mc
    assert mc["refitted"] <= mc["refit"] and (mc["ok"] or mc["refitted"] or not mc["refit"]), mc
    assert f["capacity_modelled"] and f["capacity_band_pct"] > 0, "modelled, with its error band"
    # 1 GPU, 2 replicas, TP=2 (modelled): replicas share nothing, TP=2 adds all-reduces
    cap, rate, p = f["capacity_ratio"], f["rate_ratio"], f["precision"]
    assert cap["2 replicas"] == pytest.approx(2.0, rel=1e-9) and 1 < cap["TP=2"] < 2, cap
    assert abs(rate["2 replicas"] - 2) <= 2 * ((1 + p) ** 2 - 1), rate  # the bisections' tolerance
    assert 1 < rate["TP=2"] < 2, rate
    assert all(0 < u <= f["vouch"] + 1e-9 for u in f["utilization"].values()), f["utilization"]
    assert f["p99_tpot"]["TP=2"] < f["p99_tpot"]["1 GPU"], "TP=2 buys latency"
    kv = f["kv_tokens"]
    assert kv["2 replicas"] == kv["1 GPU"] and kv["TP=2"] > 2 * kv["1 GPU"], "and KV room"
    # $/M from the steady-state throughput of a stable answer; never from an unstable run
    for label, c in f["costs"].items():
        steady = c["gpus"] * f["price"] / (c["rate"] * c["output_len"] * 3600) * 1e6
        assert c["steady"] is True and c["cost"] == pytest.approx(steady, rel=1e-9), (label, c)
    costs = {label: c["cost"] for label, c in f["costs"].items()}
    assert costs["2 replicas"] == pytest.approx(costs["1 GPU"], rel=0.05), costs
    assert costs["TP=2"] > costs["1 GPU"], "less than twice the rate for twice the price"
    assert f["unstable_costs"] and all(c is None for c in f["unstable_costs"])
    # the exercise: a TPOT tighter than one GPU's decode step: only TP=2 meets it
    tight, floor, slo = f["tight_rate"], f["tight_floor"], f["tight_tpot"]
    assert tight["1 GPU"] is None and tight["2 replicas"] is None and tight["TP=2"] > 0, tight
    assert floor["2 replicas"] == floor["1 GPU"] > slo > floor["TP=2"], (floor, slo)
    assert "needs" in f["too_big"] and "GB" in f["too_big"]


def check_12(f: dict) -> None:
    assert set(f["row_keys"]) == {"kv-cache", "int8", "speculative", "continuous"}
    assert all(keys == f["expected_keys"] for keys in f["row_keys"].values()), "the row format"
    for trick, regimes in f["regimes"].items():  # the split gave every baseline that ran a regime
        ran = [r for r, s in zip(regimes, f["skipped"][trick]) if s is None]
        assert ran and all(r in {"memory", "compute", "overhead"} for r in ran), (trick, regimes)
    assert all(w for whys in f["why"].values() for w in whys), "a why line for every setting"
    hows = [h for hs in f["how"].values() for h in hs]
    assert set(hows) <= {"measured", "modelled from measured parts"}, hows
    kv = f["predicted"]["kv-cache"]  # the cost model: recomputing L tokens never beats reading them
    assert all(p >= 1 for p in kv) and kv == sorted(kv), kv
    assert f["crossover_predicted"]["kv-cache"] is None, "the cache never stops paying (modelled)"
    b = [p for p in f["predicted"]["int8"] if p is not None]  # fewer weight bytes matter less
    assert b and all(p >= 1 - 1e-9 for p in b) and b == sorted(b, reverse=True), b  # as FLOPs grow
    assert f["values"]["continuous"] == [0.0, 1.0] and f["atlas_rows"] == 4
    # repeats with their spread shown: one spread per row (None only where a trick times no series)
    assert f["repeats"] >= 3
    assert all(len(f["spread_pct"][t]) == len(v) for t, v in f["values"].items())
    assert all(p is None or p >= 0 for ps in f["spread_pct"].values() for p in ps)
    # like for like: the parts formula at every batch, batch 1 included
    assert len(f["parts_speedup"]) == len(f["spec_batches"]) and all(
        s > 0 for s in f["parts_speedup"]
    )
    lev = f["leviathan"]  # Leviathan's bound (free verify) from the measured alpha and draft cost
    assert lev["bound"] == pytest.approx(
        [expected_speedup(lev["alpha"], k, lev["c"]) for k in lev["ks"]]
    )
    assert all(b < k + 1 for b, k in zip(lev["bound"], lev["ks"]))
    _check_12_map(f)


def _check_12_map(f: dict) -> None:
    """Speculation's batch x context map: its shape, and (modelled values on paper, never a
    timing) the flip at large batch that moves out with the context; the pair check's verdicts."""
    for m in f["spec_map"].values():
        assert len(m["speedup"]) == len(m["contexts"]) == len(m["flips"]) >= 2
        assert all(len(row) == len(m["batches"]) >= 2 for row in m["speedup"])
    p = f["spec_map"]["paper"]
    short = p["speedup"][0]  # the shortest context: pays at batch 1, costs at the largest batch
    assert short[0] > 1 > short[-1], short
    assert p["verify_cost"][0][-1] > 2 * p["verify_cost"][0][0], "the verify turns compute-bound"
    flips = [float("inf") if x is None else x for x in p["flips"]]
    assert flips[0] < float("inf") and flips == sorted(flips), "the flip moves out with context"
    assert flips[-1] > flips[0], p["flips"]
    c1 = [row[0] for row in p["draft_cost"]]  # batch 1: the draft's cost beside the target
    assert all(0 < c < 1 for c in c1) and max(c1) < 1.1 * min(c1), c1  # cheaper; moves little
    measured = f["spec_map_measured"]  # labelled: device, dtype, repeats
    assert measured and all(m["repeats"] >= 3 and m["device"] and m["dtype"] for m in measured)
    v = f["pair"]["verdicts"]
    assert v == {"notebook": True, "GPU pair on paper": True, "a mismatched pair": False}, v
    line = f["pair"]["mismatched_line"]
    assert "differ" in line and "\n" not in line, line


def check_13(f: dict) -> None:
    for name in ("overload", "kv-exhaustion", "head-of-line", "straggler", "cold-start"):
        assert f[name]["verdict"] and not f[name]["partial"], f"{name}: a verdict from a whole run"
    # counts and judgements from the records, never a timing
    # the trend test on the records: the queue grows at 3x the calibrated rate, and stays bounded
    # for one replica of the fix
    assert f["overload_steady"] is False, "unstable at 3x what the calibration burst drained"
    assert f["overload_fixed_steady"] is True, "one replica of the fix: steady"
    kv = f["kv_preemptions"]
    assert kv["broken"] > 0 and kv["fixed"] == 0, "preempted with few blocks, never with many"
    assert f["kv_blocks"]["broken"] < f["kv_blocks"]["fixed"] and f["kv_recomputed_tokens"] > 0
    hol = f["hol"]
    assert hol["largest_prefill"]["broken"] >= hol["long_len"], "the long prompt in one pass"
    assert 0 < hol["largest_prefill"]["fixed"] <= hol["chunk"], "chunked: no pass above the chunk"
    assert 0 < f["straggler_util"]["broken"] < 1, "a static batch's slots idle behind a straggler"
    # the evidence the runs hold, read from their records: the trend test's queue and the passes
    assert f["overload_queue_peak"] >= 1
    n = f["overload_requests"]
    assert n["short"] < n["broken"] <= n["fixed"], "the short run is a prefix; the fix runs longest"
    assert f["kv_passes"]["broken"] > 0 and f["kv_passes"]["fixed"] > 0
    if "memory_wall" in f:  # on the CPU: the cost model's batch, then a real failure, caught
        mw = f["memory_wall"]
        assert mw["predicted_batch"] > 0 and mw["failed_batch"] is not None, mw


def check_14(f: dict) -> None:
    E, k, batches = f["E"], f["k"], f["batches"]
    assert f["batch1_touched"] == [k] * f["moe_layers"], "one token reads exactly its k experts"
    assert f["touched_min"][0] == f["touched_max"][0] == k and batches[0] == 1
    assert all(k <= lo <= hi <= E for lo, hi in zip(f["touched_min"], f["touched_max"]))
    # a batch's rows are a prefix of the next batch's: the experts touched can only grow
    for touched in (f["touched"], f["random_touched"]):
        assert all(a <= b for a, b in zip(touched, touched[1:])), touched
    # uniform routing spreads the most: a trained (skewed) router touches at most about as many
    assert all(m <= u + 1.5 for m, u in zip(f["touched"], f["formula"])), f["touched"]
    # a random router is close to uniform: near the formula, and every expert read at the end
    for measured, formula in zip(f["random_touched"], f["random_formula"]):
        assert abs(measured - formula) <= 0.2 * E, (measured, formula)
    assert f["random_touched_min"][-1] == E
    # bytes follow the experts touched, from the dense-active size towards the dense-total size
    assert all(a <= b for a, b in zip(f["bytes"], f["bytes"][1:]))
    assert f["bytes"][0] == pytest.approx(f["dense_active"][0], rel=1e-9)
    assert all(b <= t * (1 + 1e-9) for b, t in zip(f["bytes"], f["dense_total"]))
    # while the FLOPs per token stay the active experts'
    assert f["flops_per_token"] == pytest.approx([f["flops_per_token"][0]] * len(batches), rel=1e-9)
    # the knee (modelled): further out than a dense model's, by about N_total / N_active <= E / k
    dense, moe = f["knee_dense"], f["knee_moe"]
    assert moe is not None and 0.8 * f["knee_total_active"] <= moe / dense <= f["knee_ek"]
    # one long prefill: every token routed, k experts each
    assert len(f["prefill_touched"]) == f["moe_layers"]
    assert all(k <= t <= E for t in f["prefill_touched"])
    # expert parallelism: every token's k choices land on some GPU; the busiest is at least the mean
    assert all(sum(per_gpu) == f["prefill_tokens"] * k for per_gpu in f["ep_tokens"])
    assert all(len(per_gpu) == f["ep"] for per_gpu in f["ep_tokens"])
    assert all(i >= 1 for i in f["ep_imbalance"])
    assert (
        f["a2a_bytes"] == 2 * f["prefill_tokens"] * k * f["hidden"] * 2
    )  # dispatch + combine, bf16


def check_15(f: dict) -> None:
    assert f["ops_per_layer"] == 15, (
        "a Llama layer: norm, q, k, v, rope, kv write, attention, o, add, ..."
    )
    assert f["sum_worst"] < 1e-9, "the operators' sums are the parts, exactly"
    assert f["attention_decode_bytes"] >= f["kv_expected"], "attention reads the whole KV cache"
    assert set(f["top_decode"]) == {"gate_proj", "up_proj", "down_proj"}
    assert f["decode_matmul_bounds"] == ["memory"] and f["prefill_matmul_bounds"] == ["compute"]
    assert f["lm_head_prefill_bound"] == "memory", "one row of logits: the head stays memory-bound"
    # the intensity grows with the tokens fed and crosses the ridge once, memory -> compute
    assert all(a < b for a, b in zip(f["gate_intensity"], f["gate_intensity"][1:]))
    sides = f["gate_bounds"]
    assert sides[0] == "memory" and sides[-1] == "compute" and sides == sorted(sides, reverse=True)
    for intensity, bound in zip(f["gate_intensity"], sides):
        assert (intensity > f["ridge"]) == (bound == "compute"), (intensity, f["ridge"], bound)
    # the bundled model's step: every op measured or says which row holds its time
    assert f["bundled_holders_ok"] and f["bundled_matmuls_measured"]
    assert set(f["bundled_unmeasured"]) <= {"mlp_residual", "sampling/softmax", "sampling/draw"}
    assert f["bundled_measured_total"] >= 0.999 * f["bundled_wall"], "no profiled second lost"
    assert 0 < f["bundled_overhead_share"] <= 1


CHECKS = {
    "01": check_01,
    "02": check_02,
    "03": check_03,
    "04": check_04,
    "05": check_05,
    "06": check_06,
    "07": check_07,
    "08": check_08,
    "09": check_09,
    "10": check_10,
    "11": check_11,
    "12": check_12,
    "13": check_13,
    "14": check_14,
    "15": check_15,
}


# --- static checks (fast, no kernel) --------------------------------------------------------------


def test_notebooks_exist_in_order():
    numbers = [p.name[:2] for p in NOTEBOOKS]
    assert numbers == [f"{i:02d}" for i in range(1, len(numbers) + 1)], numbers
    assert set(numbers) <= set(CHECKS), f"a notebook without checks: {set(numbers) - set(CHECKS)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_structure(path: Path):
    """Committed without outputs; a parameters cell; a hidden answer; a summary; the facts line."""
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    md = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), (
        "commit notebooks without outputs (clear them)"
    )
    params = nb.cells[_params_cell(nb)].source
    assert re.search(r"^(MODEL|TARGET) = ", params, re.M) and re.search(
        r'^DEVICE = "auto"', params, re.M
    )
    assert 'DEVICE = "cuda"' in params, "a comment shows a GPU user what to set"
    assert "<details>" in md and "Predict, then measure" in md
    assert "## Summary" in md
    summary = md.split("## Summary", 1)[1]
    assert sum(1 for line in summary.splitlines() if line.startswith("- ")) == 3, (
        "a three-line summary"
    )
    sources = "\n".join(c.source for c in code)
    assert "import explorer" in sources
    assert re.search(r"^facts = \{\}", sources, re.M), "the facts dict the test reads (FACTS_CELL)"
    assert MARKER not in sources, (
        "the test prints the facts (FACTS_CELL): keep them out of the student's view"
    )


@pytest.fixture
def busy_loops():
    """EXPLORER_NOTEBOOK_BUSY busy-loop processes for the length of one test (the load that reproduced the wait)."""
    import subprocess
    import sys

    n = int(os.environ.get("EXPLORER_NOTEBOOK_BUSY", "0") or 0)
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield n
    finally:
        for p in procs:
            p.kill()
            p.wait()


# --- execution --------------------------------------------------------------------------------------


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_runs_and_teaches(path: Path, record_property, busy_loops):
    nb = nbformat.read(path, as_version=4)
    if not BUNDLED and _needs_bundled(nb, _overrides(path.stem)):
        pytest.skip("the bundled models are missing: run `python scripts/train_bundled.py`")
    facts, seconds, ran = execute(path)
    record_property("seconds", round(seconds, 1))
    phases = ran.metadata["explorer_phases"]
    slowest = sorted(ran.metadata["explorer_cell_seconds"].items(), key=lambda kv: -kv[1][1])[:3]
    lag = ran.metadata["explorer_max_reply_lag_s"]
    timing = (
        f"{path.name}: {seconds:.1f} s; {phases}; slowest cells (index: [send, reply] s): "
        f"{dict(slowest)}; max reply lag {lag} s; busy loops {busy_loops}"
    )
    record_property("timing", timing)  # printed at the end of every run (tests/conftest.py)
    print(timing)
    CHECKS[path.name[:2]](facts)
