"""The what-if's settings, each declared once with its range, default, label and help (setting(),
as the engines' Knobs are): the chip machine's parameters, the memory plan's and vLLM's
scheduler defaults (WhatIf), and how the GPUs are laid out (Deployment: tensor parallel inside
a replica, independent replicas behind a load balancer). The CLI, the Capacity tab and the
checks read these Specs; DEFAULTS and RANGES are the same facts as plain dicts.

The chip's realisation (efficiencies, kernel floor, per-layer time, all-reduce latency) was
fitted on Vidur's measured operator table (A100, H100; per chip family where they differ), the
per-step overhead, request latency and the API server's time per token on the published runs of
sources S3 and S9 (vLLM 0.11 / 0.19 through `vllm bench serve`), the other sources held out:
`explorer bench simulate --published --fit` (explorer.serving.simulate.fit, whose FITTED are
these values, rounded). The rest are vLLM's defaults.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from explorer.engine.settings import Spec, setting, specs, validate


@dataclass
class WhatIf:
    """The chip machine's and the memory plan's parameters (every one a stated number)."""

    bw_efficiency: float = setting(
        0.75,
        "sustained bandwidth",
        "share of the chip's peak memory bandwidth an iteration sustains (fitted on Vidur's "
        "GEMMs; per chip family: FAMILY_DEFAULTS)",
        low=0.0,
        high=1.0,
        low_open=True,
        step=0.01,
    )
    flop_efficiency: float = setting(
        0.71,
        "FLOP efficiency",
        "share of the chip's peak FLOP/s the GEMMs and attention reach (fitted on Vidur's GEMMs)",
        low=0.0,
        high=1.0,
        low_open=True,
        step=0.01,
    )
    iteration_overhead_s: float = setting(
        1.063e-3,
        "per-step overhead (s)",
        "seconds added to every iteration: scheduling, sampling, Python (fitted on the light "
        "runs' TPOT)",
        low=0.0,
    )
    layer_overhead_s: float = setting(
        2.15e-5,
        "per-layer overhead (s)",
        "seconds per layer per iteration: the layer's small kernels the work sum gives no bytes "
        "(norms, RoPE, activation, residual add) at their launch floor, every step (CUDA graphs "
        "hide the CPU's launches, not the kernels' GPU time; fitted on Vidur's operator table)",
        low=0.0,
    )
    kernel_floor_s: float = setting(
        4e-6,
        "kernel launch floor (s)",
        "the least time one GEMM kernel takes: an iteration's fused GEMM takes at least 4 per "
        "layer x this (fitted on Vidur's operator table)",
        low=0.0,
    )
    sequence_overhead_s: float = setting(
        0.0,
        "per-request overhead (s)",
        "seconds per request in an iteration, added to it (engine-side scheduling and input "
        "preparation; not fitted: the heavy runs cannot tell it from the API server's)",
        low=0.0,
    )
    stream_token_s: float = setting(
        0.0,
        "API server per token (s)",
        "seconds the API server spends on each request's token of an iteration (detokenising, "
        "streaming); it runs beside the GPU (vLLM V1's API-server process), so an iteration "
        "takes at least requests x this (fitted on the heavy runs; 0 offline)",
        low=0.0,
    )
    request_latency_s: float = setting(
        0.053,
        "request latency (s)",
        "per request outside the engine: HTTP, tokenising (fitted on the light runs' TTFT)",
        low=0.0,
    )
    allreduce_latency_s: float = setting(
        3.65e-5,
        "all-reduce latency (s)",
        "fixed time of one tensor-parallel all-reduce (fitted on Vidur's NCCL all-reduces)",
        low=0.0,
    )
    gpu_memory_utilization: float = setting(
        0.9,
        "GPU memory utilization",
        "share of each GPU's memory the engine may use (vLLM's default)",
        low=0.0,
        high=1.0,
        low_open=True,
    )
    activation_reserve_gb: float = setting(
        2.0, "activation reserve (GB)", "memory per GPU kept for activations", low=0.0
    )
    page_size: int = setting(16, "page size", "tokens per KV block (vLLM's default)", low=1)
    max_batch_tokens: int = setting(
        8192, "max batch tokens", "tokens per iteration at most (vLLM's chunked prefill)", low=1
    )
    max_batch: int = setting(
        256, "max batch", "requests per iteration at most (vLLM's max_num_seqs)", low=1
    )

    def __post_init__(self) -> None:
        validate(self)


@dataclass
class Deployment:
    """How the GPUs serve: `tp` GPUs in tensor parallel make one replica; `replicas` independent
    replicas sit behind a load balancer that spreads the requests evenly (tp x replicas GPUs)."""

    tp: int = setting(1, "tensor parallel", "GPUs per replica (split every weight)", low=1)
    replicas: int = setting(
        1, "replicas", "independent copies behind a load balancer, each tp GPUs", low=1, high=4096
    )

    def __post_init__(self) -> None:
        validate(self)

    @property
    def gpus(self) -> int:
        return self.tp * self.replicas


DEFAULTS = asdict(WhatIf())
# Chip families whose sustained fractions and kernel terms Vidur's operator table measured apart
# (explorer.serving.simulate.fit); a chip of no family here (MI300X, L40S, ...) takes DEFAULTS,
# the pooled values. A setting the caller gives always wins over its family's.
CHIP_FAMILIES = {
    "H100 SXM": "hopper",
    "H200": "hopper",
    "A100 80GB": "ampere",
    "A100 40GB": "ampere",
}
FAMILY_DEFAULTS: dict[str, dict[str, float]] = {
    "hopper": {"bw_efficiency": 0.82, "layer_overhead_s": 1.85e-5, "allreduce_latency_s": 3.6e-5},
    "ampere": {"bw_efficiency": 0.73, "layer_overhead_s": 2.3e-5, "allreduce_latency_s": 4e-5},
}


# Per serving engine (a simulator policy), the per-request latency outside the engine loop
# (HTTP, tokenising, the first token's trip through the API server), fitted on the light
# (concurrency <= 8) runs of that engine in the training sources (fit.ENGINE_SOURCES); an
# engine not here (vLLM, the lab's) takes DEFAULTS' request_latency_s, fitted on vLLM's runs.
ENGINE_DEFAULTS: dict[str, dict[str, float]] = {
    "sglang": {"request_latency_s": 0.02},
    "trtllm": {"request_latency_s": 0.038},
}
# Realisation families of a chip under one generation of a serving stack, where the published
# runs show the chip on paper (DEFAULTS) far from what that stack reached: name -> (the chip,
# the simulator policies that select it, what it describes). Fitted on the published serving
# runs of one source each (explorer.serving.simulate.fit_stack.STACK_SOURCES), the chip's
# other sources held out.
STACK_FAMILIES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "cdna3-vllm-v0": (
        "MI300X",
        ("vllm-v0",),
        "MI300X under vLLM before 0.8 (V0 engine; ROCm 6.1-6.2 builds of 2024, before the AITER "
        "kernels and the V1 engine reached ROCm in 2025): vLLM 0.8+ on MI300X takes DEFAULTS",
    ),
}
STACK_DEFAULTS: dict[str, dict[str, float]] = {
    "cdna3-vllm-v0": {
        "bw_efficiency": 0.549,
        "sequence_overhead_s": 1.9268e-3,
        "flop_efficiency": 0.082,
    },
}


def stack_family(chip_name: str, engine: str | None = None) -> str | None:
    """The STACK_FAMILIES name of this chip under this simulator policy (None: none)."""
    for name, (chip, policies, _) in STACK_FAMILIES.items():
        if chip == chip_name and engine in policies:
            return name
    return None


def defaults_for(chip_name: str, engine: str | None = None) -> dict:
    """The what-if's defaults on this chip: DEFAULTS with its family's fitted values over them,
    and, under `engine` (a simulator policy such as "sglang"), the engine's and its stack
    family's."""
    stack = STACK_DEFAULTS.get(stack_family(chip_name, engine) or "", {})
    chip = FAMILY_DEFAULTS.get(CHIP_FAMILIES.get(chip_name, ""), {})
    return {**DEFAULTS, **chip, **ENGINE_DEFAULTS.get(engine or "", {}), **stack}


SPECS: dict[str, Spec] = specs(WhatIf)
# (lowest, highest, whether the lowest is allowed) per setting, from the declarations
RANGES = {
    n: (s.low, math.inf if s.high is None else s.high, not s.low_open) for n, s in SPECS.items()
}
WHOLE = tuple(f.name for f in fields(WhatIf) if SPECS[f.name].kind is int)


def check_settings(settings: dict) -> None:
    """Refuse, in one line naming the field, a what-if setting out of its range (nan, inf too)."""
    for name, value in settings.items():
        if name not in SPECS:
            raise ValueError(f"unknown what-if setting {name!r}; known: {', '.join(DEFAULTS)}")
        spec = SPECS[name]
        whole_float = isinstance(value, float) and math.isfinite(value) and value.is_integer()
        why = spec.problem(int(value) if spec.kind is int and whole_float else value)
        if why:
            raise ValueError(f"what-if setting {name} {why}")


def check_replicas(replicas) -> None:
    """--replicas in one line when it is not a whole number >= 1."""
    why = specs(Deployment)["replicas"].problem(replicas)
    if why:
        raise ValueError(f"--replicas {why}")
