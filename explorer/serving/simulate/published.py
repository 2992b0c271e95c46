"""How far the what-if is from real GPU runs: published, measured serving runs, simulated.

assets/published/runs.json holds each run with its source (repository + path + commit, or URL),
model, chip, tensor-parallel size, dtypes, engine and settings, workload (fixed lengths, lengths
drawn to published means, or per-request lengths) and measured metrics. For each run the what-if
(explorer.serving.simulate.whatif) simulates the same workload on the same chips, and each
metric gets measured, simulated and error %.

The what-if's defaults were fitted on the runs of FIT_SOURCES only (split by source, never by
point); the other sources are held out, and every summary gives both errors side by side. The
fit itself lives in explorer.serving.simulate.fit (`explorer bench simulate --published --fit`).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from explorer._format import pct
from explorer.model.loader import ASSETS

PUBLISHED = ASSETS / "published" / "runs.json"
FIT_SOURCES = ("S3", "S9", "S15", "S16")  # S15: the cdna3-vllm-v0 stack family only
# (fit_stack); S16: the SGLang and TensorRT-LLM request latencies only (fit.ENGINE_SOURCES)
METRICS = (
    "output_throughput",
    "request_throughput",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "median_itl_ms",
    "median_e2el_ms",
)
UNITS = {  # each measured metric's unit (its name says it) and the most a real run can read
    "output_throughput": ("output tokens/s", 1e8),
    "request_throughput": ("requests/s", 1e6),
    "median_ttft_ms": ("ms", 1e7),
    "p99_ttft_ms": ("ms", 1e8),
    "median_tpot_ms": ("ms", 1e7),
    "median_itl_ms": ("ms", 1e7),
    "median_e2el_ms": ("ms", 1e8),
}
TARGETS = {"output_throughput": 15.0, "median_tpot_ms": 15.0, "median_ttft_ms": 25.0}
POINT_KEYS = ("id", "source", "model", "chip", "tp", "dtype", "engine", "workload", "measured")
WORKLOAD_KEYS = {
    "fixed": ("num_prompts", "input_len", "output_len"),
    "stats": ("num_prompts", "input_mean", "output_mean", "spread"),
    "uniform": ("num_prompts", "input_mean", "output_mean", "spread"),
    "replay": ("input_lens", "output_lens"),
}
# A run of more requests or output tokens is simulated with its first ones (TensorRT-LLM's
# 30,000 at 128/128, 3,000 at 128/2048): enough waves of the batch for its steady state.
SIMULATE_AT_MOST = 6000
SIMULATE_TOKENS = 1_500_000
SIMULATED_SETTINGS = (  # the what-if settings a replay passes on (request latency is added after)
    "bw_efficiency",
    "flop_efficiency",
    "iteration_overhead_s",
    "layer_overhead_s",
    "kernel_floor_s",
    "sequence_overhead_s",
    "stream_token_s",
    "allreduce_latency_s",
)
SHOWN_SETTINGS = (*SIMULATED_SETTINGS, "request_latency_s")


def load(path=None) -> dict:
    """The published runs file (default PUBLISHED), checked: every point names its source, its
    engine and version, and has what it needs; every measured value is a finite number > 0."""
    path = PUBLISHED if path is None else path
    where = str(path)
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{where}: cannot read it ({err})") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: not JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(data, dict) or not isinstance(data.get("points"), list):
        raise ValueError(f"{where}: no 'points' list of published runs")
    if not data["points"]:
        raise ValueError(f"{where}: its 'points' list is empty: no published run to compare with")
    sources = data.get("sources") or {}
    for i, point in enumerate(data["points"]):
        name = point.get("id", i) if isinstance(point, dict) else i
        check_point(point, sources, f"{where}: point {name}")
    return data


def check_point(point: dict, sources: dict, where: str) -> None:
    if not isinstance(point, dict):
        raise ValueError(f"{where}: a point must be a JSON object, got {type(point).__name__}")
    missing = [k for k in POINT_KEYS if k not in point]
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)}")
    check_engine_named(point.get("engine"), where)
    from explorer.serving.simulate.engine_map import policy_of

    policy_of(point["engine"], where)  # an engine the what-if has a policy for
    check_measured(point["measured"], where)
    for k, again in enumerate(point.get("repeats") or []):  # the same run repeated by its source
        check_measured(again, f"{where}: repeats[{k}]")
    tp = point["tp"]
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ValueError(f"{where}: tp must be a whole number >= 1, got {tp!r}")
    if not isinstance(point["source"], str) or point["source"] not in sources:
        raise ValueError(f"{where}: source {point['source']!r} is not in the file's sources")
    wl = point["workload"]
    kind = wl.get("kind") if isinstance(wl, dict) else None
    if kind not in WORKLOAD_KEYS:
        raise ValueError(
            f"{where}: workload kind must be one of {', '.join(WORKLOAD_KEYS)}, got {kind!r}"
        )
    lacking = [k for k in WORKLOAD_KEYS[kind] if k not in wl]
    if lacking:
        raise ValueError(f"{where}: workload ({kind}) is missing {', '.join(lacking)}")
    check_workload_numbers(wl, where)
    if not any(point["measured"].get(m) is not None for m in METRICS):
        raise ValueError(f"{where}: no measured metric (known: {', '.join(METRICS)})")


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_engine_named(engine, where: str) -> None:
    """A run names its engine and that engine's version, e.g. "vLLM 0.6.0"."""
    if not isinstance(engine, str) or not engine.strip():
        raise ValueError(f"{where}: engine must name the serving engine and its version, e.g. "
                         f"'vLLM 0.6.0'; got {engine!r}")  # fmt: skip
    if not any(c.isdigit() for c in engine):
        raise ValueError(
            f"{where}: engine {engine!r} gives no version; write it as 'vLLM 0.6.0' (name, then "
            "version or build)"
        )


def check_measured(measured, where: str) -> None:
    """Every measured value: a known metric (its unit in its name), a finite number > 0 and
    below what any real run reads."""
    if not isinstance(measured, dict):
        raise ValueError(f"{where}: measured must be an object of metrics, got {measured!r}")
    for key, value in measured.items():
        if key not in UNITS:
            known = ", ".join(f"{k} ({u})" for k, (u, _) in UNITS.items())
            raise ValueError(f"{where}: measured.{key} is not a known metric; known: {known}")
        unit, most = UNITS[key]
        if value is None:
            continue
        if not _number(value) or not 0 < value <= most:
            raise ValueError(
                f"{where}: measured.{key} must be a finite number of {unit} > 0 and <= {most:g}, "
                f"got {value!r}"
            )


def check_workload_numbers(wl: dict, where: str) -> None:
    """The workload's counts and lengths are numbers > 0 (spread >= 0; a rate or a concurrency
    may be null: all at once, no cap)."""
    for key in ("num_prompts", "input_len", "output_len", "input_mean", "output_mean",
                "input_max", "output_max", "request_rate", "max_concurrency", "spread"):  # fmt: skip
        value = wl.get(key)
        if value is None:
            continue
        low_ok = value >= 0 if key == "spread" and _number(value) else _number(value) and value > 0
        if not low_ok:
            need = ">= 0" if key == "spread" else "> 0"
            raise ValueError(
                f"{where}: workload.{key} must be a finite number {need}, got {value!r}"
            )
    for key in ("input_lens", "output_lens"):
        lens = wl.get(key)
        if lens is not None and (not isinstance(lens, list) or not lens
                                 or not all(_number(n) and n >= 1 for n in lens)):  # fmt: skip
            raise ValueError(f"{where}: workload.{key} must be a list of lengths >= 1")
    if wl.get("kind") == "replay":  # its requests are its lengths, one pair per request
        n, m = len(wl["input_lens"]), len(wl["output_lens"])
        if n != m or wl.get("num_prompts", n) != n:
            raise ValueError(
                f"{where}: a replay has one input and one output length per request: "
                f"{n} input_lens, {m} output_lens"
                + (f", num_prompts {wl['num_prompts']!r}" if "num_prompts" in wl else "")
            )


def point_requests(point: dict):
    """(Workload, requests) of a published run: its lengths and its arrivals, seeded."""
    from explorer.serving import replay

    wl = point["workload"]
    kind = wl["kind"]
    common = {"request_rate": wl.get("request_rate"), "max_concurrency": wl.get("max_concurrency")}
    if kind == "replay":
        return replay.replay_result(
            {**common, "input_lens": wl["input_lens"], "output_lens": wl["output_lens"]},
            where=point["id"],
        )
    n = int(wl["num_prompts"])
    if kind == "fixed":
        ins, outs = [int(wl["input_len"])] * n, [int(wl["output_len"])] * n
        w = replay.workload_for(n, ins, outs, **common)
        return w, replay.requests_of(w, ins, outs)
    if kind == "uniform":
        import random

        rng = random.Random(0)
        s = float(wl["spread"])
        ins = [max(1, round(wl["input_mean"] * rng.uniform(1 - s, 1 + s))) for _ in range(n)]
        outs = [max(1, round(wl["output_mean"] * rng.uniform(1 - s, 1 + s))) for _ in range(n)]
        w = replay.workload_for(n, ins, outs, **common)
        return w, replay.requests_of(w, ins, outs)
    return replay.from_stats(
        n,
        input_mean=wl["input_mean"],
        output_mean=wl["output_mean"],
        spread=float(wl["spread"]),
        input_max=wl.get("input_max"),
        output_max=wl.get("output_max"),
        **common,
    )


def simulate_point(point: dict, settings: dict | None = None, policy: str | None = None) -> dict:
    """The what-if's result keys for one published run (`settings`, then the point's own
    what_if settings and its engine flags, over the chip's defaults) under the scheduler its
    engine ran (engine_map.run_setup; `policy`: another one, e.g. "continuous"); the per-request
    latency is left out (errors() adds it: the point's what_if request_latency_s where it gives
    one, as an offline harness does)."""
    from explorer.serving.simulate.engine_map import run_setup, run_shape
    from explorer.serving.simulate.engine_policies import chip_knobs
    from explorer.serving.simulate.run import simulate
    from explorer.serving.simulate.whatif import check_context, chip_model

    mapped, knobs, flags_what_if = run_setup(point)
    if policy not in (None, mapped):
        knobs, flags_what_if = {}, {}
    policy = policy or mapped
    weights = "bfloat16" if point["dtype"] == "fp8" else point["dtype"]
    info = run_shape(point["model"], weights)
    # the run's own settings (its engine's flags, its harness's) win over the what-if's
    stated = {**flags_what_if, **point.get("what_if", {})}
    overrides = {**(settings or {}), **stated, "request_latency_s": 0.0}
    model, extra = chip_model(
        info,
        point["chip"],
        int(point["tp"]),
        dtype=point["dtype"],
        kv_dtype=point.get("kv_dtype"),
        engine=policy,
        **overrides,
    )
    wl, requests = point_requests(_at_most(point, SIMULATE_AT_MOST, SIMULATE_TOKENS))
    check_context(info, requests)
    knobs = {**chip_knobs(policy, extra, point["chip"], stated), **knobs}
    return simulate(info, wl, policy, model, requests=requests, **knobs).result


def errors(point: dict, simulated: dict, request_latency_s: float) -> list[dict]:
    """Measured, simulated and error % per metric the run published."""
    rows = []
    for metric in METRICS:
        m = point["measured"].get(metric)
        if m is None:
            continue
        s = simulated.get(metric)
        if s is not None and metric in ("median_ttft_ms", "median_e2el_ms"):
            s = s + request_latency_s * 1e3  # a constant per request: the median moves by it
        rows.append(
            {
                "id": point["id"],
                "source": point["source"],
                "model": point["model"],
                "chip": f"{point['tp']}x {point['chip']}",
                "dtype": point["dtype"]
                + (f"/kv {point['kv_dtype']}" if point.get("kv_dtype") else ""),
                "engine": point["engine"],
                "metric": metric,
                "measured": m,
                "simulated": s,
                "error_pct": None if s is None else (s - m) / m * 100,
                "split": "fitted" if point["source"] in FIT_SOURCES else "held out",
                "requests": point["workload"].get("num_prompts"),
                "requests_simulated": simulated.get("completed"),
            }
        )
    return rows


def compare_all(
    points: list[dict], settings: dict | None = None, progress=None, policy: str | None = None
) -> list[dict]:
    """Measured vs simulated rows of every point (policy: one scheduler for all instead of the
    one each run's engine names; a point the what-if cannot run gives rows marked unsupported)."""
    from explorer.serving.simulate.engine_map import policy_of

    given = settings or {}  # what is not given: the chip's defaults (whatif.defaults_for)
    rows = []
    for point in points:
        try:
            sim = simulate_point(
                point, {k: v for k, v in given.items() if k in SIMULATED_SETTINGS}, policy
            )
        except ValueError as err:  # the what-if cannot run it: counted as unsupported, and why
            sim = {"unsupported": str(err)}
        got = errors(point, sim, request_latency(point, given.get("request_latency_s"), policy))
        for row in got:
            row["policy"] = policy or policy_of(point["engine"])
            if "unsupported" in sim:
                row["unsupported"] = sim["unsupported"]
        rows.extend(got)
        if progress:
            progress(point["id"])
    return rows


def request_latency(point: dict, given: float | None = None, policy: str | None = None) -> float:
    """The per-request latency a run's TTFT and E2E get: its own what_if value (an offline
    harness: 0), else `given`, else its engine's default on its chip (defaults_for)."""
    from explorer.costs.hardware import chip_named
    from explorer.serving.simulate.engine_map import policy_of
    from explorer.serving.simulate.whatif_settings import defaults_for

    if "request_latency_s" in point.get("what_if", {}):
        return point["what_if"]["request_latency_s"]
    if given is not None:
        return given
    engine = policy or policy_of(point["engine"])
    return defaults_for(chip_named(point["chip"]).name, engine)["request_latency_s"]


def _at_most(point: dict, n: int, tokens: int | None = None) -> dict:
    """The point with at most n requests, and (tokens) at most that many output tokens in all,
    but never fewer than four rounds of its concurrency."""
    wl = point["workload"]
    if "num_prompts" not in wl:
        return point
    if tokens:
        out = wl.get("output_len") or wl.get("output_mean")
        n = min(n, max(4 * (wl.get("max_concurrency") or 0), int(tokens // out)))
    if wl["num_prompts"] <= n:
        return point
    return {**point, "workload": {**wl, "num_prompts": n}}


def summary(rows: list[dict]) -> list[dict]:
    """Median |error| per metric, on the fitted and on the held-out points, with the targets."""
    out = []
    for metric in METRICS:
        line = {"metric": metric, "target_pct": TARGETS.get(metric)}
        for split in ("fitted", "held out"):
            errs = [
                abs(r["error_pct"])
                for r in rows
                if r["metric"] == metric and r["split"] == split and r["error_pct"] is not None
            ]
            key = split.replace(" ", "_")
            line[key] = statistics.median(errs) if errs else None
            line[f"n_{key}"] = len(errs)
        if line["n_fitted"] or line["n_held_out"]:
            out.append(line)
    return out


STORED = PUBLISHED.with_name("validation.json")


def _fingerprint(path=None) -> dict:
    """What a stored comparison depends on: the runs file, the chip machine's rule and the
    what-if's defaults."""
    import hashlib

    from explorer.serving.simulate.whatif import CHIP_RULE, DEFAULTS
    from explorer.serving.simulate.whatif_settings import (
        ENGINE_DEFAULTS,
        FAMILY_DEFAULTS,
        STACK_DEFAULTS,
    )

    return {
        "runs_sha256": hashlib.sha256(Path(path or PUBLISHED).read_bytes()).hexdigest(),
        "rule_sha256": hashlib.sha256(CHIP_RULE.encode()).hexdigest()[:16],
        "settings": dict(DEFAULTS),
        "family_settings": FAMILY_DEFAULTS,
        "stack_settings": STACK_DEFAULTS,
        "engine_settings": ENGINE_DEFAULTS,
        "fit_sources": list(FIT_SOURCES),
        "scheduler": "each run's engine (engine_map)",  # was: transformers' FIFO for every run
    }


_MEMO: dict[str, dict] = {}


def validation_summary(*, compute: bool = True, progress=None, save: bool = False) -> dict | None:
    """How far the what-if was from real runs: the table (one row per published run and metric:
    measured, simulated, error %), the median |error| per metric on fitted and held-out points,
    which sources were fitted and which held out, and the what-if settings used (its defaults).

    Read from assets/published/validation.json when that was made from the same runs file and
    defaults; else simulated (every published run once: minutes) when `compute`, else None.
    `save` writes the result there (explorer bench simulate --published --save)."""
    key = _fingerprint()
    if "last" in _MEMO and _MEMO["last"]["fingerprint"] == key:
        return _MEMO["last"]
    if STORED.exists():
        stored = json.loads(STORED.read_text())
        if stored.get("fingerprint") == key:
            _MEMO["last"] = stored
            return stored
    if not compute:
        return None
    from explorer.serving.simulate.published_report import report

    data = load()
    rows = compare_all(data["points"], progress=progress)
    out = {
        "fingerprint": key,
        "rows": rows,
        "summary": summary(rows),
        "fit_sources": list(FIT_SOURCES),
        "held_out_sources": sorted({p["source"] for p in data["points"]} - set(FIT_SOURCES)),
        "settings": {k: key["settings"][k] for k in SHOWN_SETTINGS},
        "family_settings": key["family_settings"],
        "stack_settings": key["stack_settings"],
        "engine_settings": key["engine_settings"],
        "sources": data["sources"],
        "report": report(rows, data["points"]),
    }
    if save:
        STORED.write_text(json.dumps(out, indent=1) + "\n")
    _MEMO["last"] = out
    return out


def summary_text(s: dict) -> str:
    """One line per metric: the what-if's median |error| against published runs."""
    lines = [
        f"how far the what-if was from published GPU runs (fitted on {', '.join(s['fit_sources'])}; "
        f"held out: {', '.join(s['held_out_sources'])}):"
    ]
    for line in s["summary"]:
        f, h = pct(line["fitted"]), pct(line["held_out"])
        t = f" (target {line['target_pct']:.0f}%)" if line["target_pct"] else ""
        lines.append(
            f"  {line['metric']:<20} median |error| fitted {f} ({line['n_fitted']}), "
            f"held out {h} ({line['n_held_out']}){t}"
        )
    return "\n".join(lines)
