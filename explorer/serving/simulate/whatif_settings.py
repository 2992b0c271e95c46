"""The what-if's settings, each declared once with its range, default, label and help (setting(),
as the engines' Knobs are): the chip machine's parameters, the memory plan's and vLLM's
scheduler defaults (WhatIf), and how the GPUs are laid out (Deployment: tensor parallel inside
a replica, independent replicas behind a load balancer). The CLI, the Capacity tab and the
checks read these Specs; DEFAULTS and RANGES are the same facts as plain dicts.

The efficiencies and overheads were fitted (rounded) to the published runs of sources S3 and S9
(vLLM 0.11 / 0.19 through `vllm bench serve`; `explorer bench simulate --published --fit`,
assets/published/); the other sources are held out. The rest are vLLM's defaults.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from explorer.engine.settings import Spec, setting, specs, validate


@dataclass
class WhatIf:
    """The chip machine's and the memory plan's parameters (every one a stated number)."""

    bw_efficiency: float = setting(
        0.57,
        "sustained bandwidth",
        "share of the chip's peak memory bandwidth an iteration sustains (fitted)",
        low=0.0,
        high=1.0,
        low_open=True,
        step=0.01,
    )
    flop_efficiency: float = setting(
        0.4,
        "FLOP efficiency",
        "share of the chip's peak FLOP/s the GEMMs and attention reach (fitted)",
        low=0.0,
        high=1.0,
        low_open=True,
        step=0.01,
    )
    iteration_overhead_s: float = setting(
        0.0,
        "per-step overhead (s)",
        "seconds added to every iteration (fitted 0: CUDA graphs, async scheduling)",
        low=0.0,
    )
    sequence_overhead_s: float = setting(
        0.0, "per-request overhead (s)", "seconds per request in an iteration (not fitted)", low=0.0
    )
    request_latency_s: float = setting(
        0.053,
        "request latency (s)",
        "per request outside the engine: HTTP, tokenising, streaming (fitted on TTFT)",
        low=0.0,
    )
    allreduce_latency_s: float = setting(
        10e-6, "all-reduce latency (s)", "fixed time of one tensor-parallel all-reduce", low=0.0
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
