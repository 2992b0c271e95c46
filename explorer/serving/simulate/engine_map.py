"""Which simulator policy a published run ran: its `engine` field (name and version) -> a policy
of explorer.serving.simulate.engine_policies, and its `settings` flags -> that policy's knobs.

    vLLM < 0.8            vllm-v0   (V0 was the default engine until 0.8.0)
    vLLM >= 0.8           vllm      (V1)
    vLLM (CI build N)     vllm      (assumed V1: the performance-benchmark pipeline's builds of
                                     the collection are from the V1 era; the version is not
                                     visible on the page, see the source's notes)
    SGLang x              sglang
    TensorRT-LLM x        trtllm

Flags read from a run's `settings` (the rest are noted in the runs file, not modelled):
--num-scheduler-steps N (vllm-v0), --enable-chunked-prefill[=True|False] (vllm-v0; when the run
does not say, on where max_model_len, the flag's or the model's context, is above 32K, as
vLLM 0.6's EngineArgs turns it on), --max-model-len / --max_model_len N (vllm-v0 without chunked
prefill: the token budget max(N, 2048) when the run states none),
--disable-frontend-multiprocessing (vllm-v0: without it the per-request overhead is 0; see
IN_PROCESS_FRONTEND), --mem-frac / --mem-fraction-static F (SGLang: the what-if's
gpu_memory_utilization). A TensorRT-LLM run whose prompts are longer than
max_num_tokens (8,192) served them, so its context chunking was on.
"""

from __future__ import annotations

import re
from functools import lru_cache

FAMILIES = {  # the engine's name as runs write it (lower case) -> its policy family
    "vllm": "vllm",
    "sglang": "sglang",
    "tensorrt-llm": "trtllm",
    "trt-llm": "trtllm",
    "trtllm": "trtllm",
}
V1_FROM = (0, 8)  # vLLM's V1 engine is the default from 0.8.0
V0_LONG_CONTEXT = 32 * 1024  # vLLM 0.6: chunked prefill on by itself above this max_model_len
# vLLM 0.6's OpenAI server runs the engine in its own process (MQLLMEngine) unless this flag puts
# the API server in the engine's loop: only then does its per-request work (detokenising,
# streaming every token) add to each step; the what-if's per-request overhead
# (sequence_overhead_s, the cdna3-vllm-v0 stack family's, fitted on S15 which ran this flag) is
# that work, so a vllm-v0 run without the flag (offline harnesses included) sets it to 0.
IN_PROCESS_FRONTEND = "--disable-frontend-multiprocessing"
TRTLLM_MAX_NUM_TOKENS = 8192  # TensorRT-LLM's default, engine_knobs.TrtllmKnobs


def parse_engine(engine: str, where: str = "engine") -> tuple[str, tuple[int, ...] | None]:
    """(family, version) of an engine field such as "vLLM 0.6.0" or "vLLM (CI build 9515)"
    (version None for a build number); ValueError in one line for an engine without a policy."""
    text = str(engine).strip()
    name = re.split(r"[\s(]", text, maxsplit=1)[0].lower()
    if name not in FAMILIES:
        known = "vLLM (vllm, or vllm-v0 before 0.8), SGLang (sglang), TensorRT-LLM (trtllm)"
        raise ValueError(
            f"{where}: engine {text!r} has no policy in the what-if; it models {known}"
        )
    found = re.search(r"\b(\d+)\.(\d+)(?:\.(\d+))?", text[len(name) :])
    version = tuple(int(g) for g in found.groups() if g is not None) if found else None
    if version is None and not re.search(r"build\s*\d+", text, re.I):
        raise ValueError(f"{where}: engine {text!r} gives no version (e.g. 'vLLM 0.6.0')")
    return FAMILIES[name], version


def policy_of(engine: str, where: str = "engine") -> str:
    """The simulator policy a run's engine field names (see the module docstring)."""
    family, version = parse_engine(engine, where)
    if family == "vllm" and version is not None and version[:2] < V1_FROM:
        return "vllm-v0"
    return family


def flag_value(settings: str, *flags: str) -> str | None:
    """The value after the first of `flags` in a settings string ("--flag V" or "--flag=V")."""
    for flag in flags:
        found = re.search(rf"{re.escape(flag)}(?:\s+|=)(\S+)", settings or "")
        if found:
            return found.group(1)
    return None


def longest_prompt(point: dict) -> float:
    """The longest prompt a run's workload can hold (its fixed, largest or drawn-at-most length)."""
    wl = point.get("workload", {})
    if wl.get("input_lens"):
        return max(wl["input_lens"])
    if wl.get("input_len"):
        return wl["input_len"]
    if wl.get("input_max"):
        return wl["input_max"]
    return (wl.get("input_mean") or 0) * (1 + (wl.get("spread") or 0))


def run_setup(point: dict) -> tuple[str, dict, dict]:
    """(policy, its knobs from the run's settings flags, what-if settings from them)."""
    where = f"point {point.get('id', '?')}"
    policy = policy_of(point.get("engine"), where)
    flags = point.get("settings") or ""
    knobs, what_if = {}, {}
    if policy == "vllm-v0":
        steps = flag_value(flags, "--num-scheduler-steps")
        if steps:
            knobs["num_scheduler_steps"] = int(steps)
        length = flag_value(flags, "--max-model-len", "--max_model_len")
        knobs["enable_chunked_prefill"] = v0_chunked(point, flags, length)
        if IN_PROCESS_FRONTEND not in flags:
            what_if["sequence_overhead_s"] = 0.0  # no API server in the engine's loop
        if length and "max_batch_tokens" not in point.get("what_if", {}):
            what_if["max_batch_tokens"] = max(int(length), 2048)
    if policy == "trtllm" and longest_prompt(point) > TRTLLM_MAX_NUM_TOKENS:
        knobs["enable_chunked_prefill"] = True  # it served them, so its contexts were chunked
    if policy == "sglang":
        frac = flag_value(flags, "--mem-frac", "--mem-fraction-static")
        if frac:
            what_if["gpu_memory_utilization"] = float(frac)
    return policy, knobs, what_if


def v0_chunked(point: dict, flags: str, length: str | None) -> bool:
    """Whether a vLLM V0 run scheduled with chunked prefill: its --enable-chunked-prefill flag,
    else max_model_len (the flag's, the point's max_model_len where the served model's context
    differs from the shape's, else the shape's context) above V0_LONG_CONTEXT."""
    said = re.search(r"--enable-chunked-prefill(?:[=\s]+(true|false))?", flags or "", re.I)
    if said:
        return (said.group(1) or "true").lower() == "true"
    length = length or point.get("max_model_len")  # the served model's own context, stated
    if length:
        return int(length) > V0_LONG_CONTEXT
    context = run_shape(point["model"], "bfloat16").max_positions or 0
    return context > V0_LONG_CONTEXT


@lru_cache(maxsize=16)
def run_shape(name: str, dtype: str):
    """A published run's model shape (explorer.model.loader.arch_info), cached: every run of a
    source shares it."""
    from explorer.model.loader import arch_info

    return arch_info(name, dtype)
