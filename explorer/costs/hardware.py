"""Peaks of this machine, measured (memory bandwidth, dense matmul FLOP/s), and a table of known chips.

measure(device, dtype) times, with warm-up discarded and medians over repeats (CUDA events on a
GPU, perf_counter after a synchronise elsewhere; see explorer.costs.timing):

    copy        dst.copy_(src) of a buffer far larger than the last-level cache; bytes = read + write
    read        torch.mv(src.view(-1, 1024), x): a matrix-vector product over the same buffer, the
                access pattern of a decode step's weight reads (read-only); bytes = read
    cache       the same copy on a buffer a quarter of the last-level cache (working sets that fit
                in cache move faster than DRAM allows; the roofline uses this for them)
    kernels     the skinny products decode runs, in `dtype`: torch.mv of a [2048, 4096] matrix and
                F.linear of [16, 2048] by a [2048, 2048] weight and [128, 1024] by [1024, 1024]
                (weights stored [out, in] as nn.Linear does); FLOPs = 2 * M * K * N
    matmul      a @ b of two square matrices in `dtype`; FLOPs = 2 * N^3 (N = 1024 on a CPU, and for
                bf16/fp16 there small enough that one product takes ~0.1 s, as a CPU without
                half-precision units emulates them slowly; 4096 on a GPU)

bandwidth_gbps = max(copy, read) of the medians: the machine's measured bandwidth, against which
pct_of_peak_bw is reported (copy_gbps and read_gbps are kept beside it); flops = the best median
over the matmul and the kernels. The roofline bound uses the *best* repeat instead (bound_gbps,
bound_flops): a lower bound must not exceed what the machine was once seen to do, and on a shared
machine medians drift with other people's load (details["load_average"] records it). The quick
default takes about 1-2 s on an idle 2-core CPU (longer when it is busy) and is cached per
(device, dtype, threads); thorough=True uses larger sizes and more repeats. KNOWN_CHIPS are vendor
figures: peaks built from them are *modelled*.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from explorer._dtypes import DTYPES
from explorer.costs.kvdtype import ALIASES, FLOAT_BYTES
from explorer.costs.timing import Measurement, time_call
from explorer.costs.timing import measure as time_repeats
from explorer.model.device import dtype_name, resolve_device

GB = 1e9


@dataclass
class Peaks:
    """Peak memory bandwidth and matmul FLOP/s of a device for a dtype, measured or modelled."""

    device: str
    dtype: str
    bandwidth_gbps: (
        float  # roofline peak: max(copy_gbps, read_gbps) for working sets beyond cache_bytes
    )
    flops: float  # dense FLOP/s in dtype: the best median over the square matmul and the skinny kernels
    method: str  # "measured" | "modelled"
    copy_gbps: float | None = None  # large copy, read + write bytes counted
    read_gbps: float | None = None  # large read-only matrix-vector product
    cache_gbps: float | None = None  # copy of a buffer that fits the last-level cache
    cache_bytes: int | None = None  # last-level cache size (bytes); None when unknown
    bound_gbps: float | None = (
        None  # best repeat of copy/read: the roofline's bandwidth (None: bandwidth_gbps)
    )
    bound_flops: float | None = (
        None  # best repeat of the matmul: the roofline's FLOP/s (None: flops)
    )
    details: dict[str, Any] = field(default_factory=dict)  # sizes, repeats, threads, timer, source

    @property
    def tflops(self) -> float:
        return self.flops / 1e12

    @property
    def roofline_flops(self) -> float:
        """FLOP/s the roofline bound divides by (the best matmul repeat when measured)."""
        return self.bound_flops or self.flops

    def bandwidth_for(self, nbytes: float) -> float:
        """GB/s the roofline bound assumes for a pass moving `nbytes` (cache speed if it fits the cache)."""
        peak = self.bound_gbps or self.bandwidth_gbps
        if self.cache_gbps and self.cache_bytes and nbytes <= self.cache_bytes:
            return max(self.cache_gbps, peak)
        return peak

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- known chips (vendor figures, dense, no sparsity) ---------------------------------------------


# The one mapping from a dtype's names to the chip table's FLOP/s field (every reader uses it).
DTYPE_FIELDS = {d.name: d.flops_field for d in DTYPES if d.flops_field}
DTYPE_SYNONYMS = ALIASES  # one spelling of the dtypes' names and bytes (explorer.costs.kvdtype)
DTYPE_BYTES = FLOAT_BYTES


def chip_dtype(dtype) -> str:
    """The table's name of a dtype ("bf16", torch.bfloat16 -> "bfloat16"; "fp8"); refuses others."""
    name = str(dtype).replace("torch.", "").lower()
    name = DTYPE_SYNONYMS.get(name, name)
    if name not in DTYPE_FIELDS:
        known = ", ".join([*DTYPE_FIELDS, *DTYPE_SYNONYMS])
        raise ValueError(f"unknown dtype {dtype!r} for the chip table; known: {known}")
    return name


@dataclass(frozen=True)
class Chip:
    name: str
    bandwidth_gbps: float
    bf16_tflops: (
        float | None
    )  # dense tensor-core / matrix-unit figure; None where the chip has none
    fp32_tflops: float
    source: str
    fp16_tflops: float | None = None
    memory_gb: float | None = None
    # GPU-to-GPU bandwidth per direction (GB/s) for tensor parallelism, and what link it is
    interconnect_gbps: float | None = None
    interconnect: str | None = None
    fp8_tflops: float | None = None  # dense FP8 tensor-core figure; None where the chip has none
    aliases: tuple[str, ...] = ()  # short names the CLI and the dashboard accept ("h100")

    def tflops(self, dtype) -> float:
        """Dense matrix TFLOP/s in `dtype`; refuses a dtype the chip has no figure for."""
        value = getattr(self, DTYPE_FIELDS[chip_dtype(dtype)])
        if value is None:
            raise ValueError(
                f"{self.name} has no published dense {chip_dtype(dtype)} figure ({self.source}); "
                f"known dtypes for it: {', '.join(self.dtypes())}"
            )
        return value

    def dtypes(self) -> list[str]:
        """The dtypes this chip has a FLOP/s figure for."""
        return [d for d, f in DTYPE_FIELDS.items() if getattr(self, f) is not None]

    @property
    def short_name(self) -> str:
        return self.aliases[0] if self.aliases else self.name


KNOWN_CHIPS: dict[str, Chip] = {
    c.name: c
    for c in [
        Chip(
            "MI300X",
            5300,
            1307.4,
            163.4,
            "AMD Instinct MI300X data sheet (dense matrix bf16/fp16; fp32 matrix)",
            fp16_tflops=1307.4,
            fp8_tflops=2614.9,
            aliases=("mi300x",),
            memory_gb=192,
            interconnect_gbps=448,
            interconnect="Infinity Fabric (7 links x 64 GB/s each way)",
        ),
        Chip(
            "H200",
            4800,
            989,
            67,
            "NVIDIA H200 Tensor Core GPU datasheet (SXM; dense, sparsity figures halved)",
            fp16_tflops=989,
            fp8_tflops=1979,
            aliases=("h200",),
            memory_gb=141,
            interconnect_gbps=450,
            interconnect="NVLink 4 (900 GB/s bidirectional, 450 each way)",
        ),
        Chip(
            "H100 SXM",
            3350,
            989,
            67,
            "NVIDIA H100 Tensor Core GPU datasheet (SXM5; dense, sparsity figures halved)",
            fp16_tflops=989,
            fp8_tflops=1979,
            aliases=("h100",),
            memory_gb=80,
            interconnect_gbps=450,
            interconnect="NVLink 4 (900 GB/s bidirectional, 450 each way)",
        ),
        Chip(
            "A100 80GB",
            2039,
            312,
            19.5,
            "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM; fp32 = non-tensor; no FP8 units)",
            fp16_tflops=312,
            aliases=("a100", "a100-80gb"),
            memory_gb=80,
            interconnect_gbps=300,
            interconnect="NVLink 3 (600 GB/s bidirectional, 300 each way)",
        ),
        Chip(
            "A100 40GB",
            1555,
            312,
            19.5,
            "NVIDIA A100 Tensor Core GPU datasheet (40GB SXM; fp32 = non-tensor; no FP8 units)",
            fp16_tflops=312,
            aliases=("a100-40gb",),
            memory_gb=40,
            interconnect_gbps=300,
            interconnect="NVLink 3 (600 GB/s bidirectional, 300 each way)",
        ),
        Chip(
            "L4",
            300,
            121,
            30.3,
            "NVIDIA L4 Tensor Core GPU datasheet (dense, sparsity figures halved)",
            fp16_tflops=121,
            fp8_tflops=242.5,
            aliases=("l4",),
            memory_gb=24,
            interconnect_gbps=32,
            interconnect="PCIe 4.0 x16 (~32 GB/s each way; no NVLink)",
        ),
        Chip(
            "T4",
            320,
            None,
            8.1,
            "NVIDIA T4 Tensor Core GPU datasheet (Turing: no bf16; fp16 mixed 65 TFLOPS)",
            fp16_tflops=65,
            aliases=("t4",),
            memory_gb=16,
        ),
        Chip(
            "RTX 4090",
            1008,
            165.2,
            82.6,
            "NVIDIA Ada Lovelace GPU architecture whitepaper, GeForce RTX 4090 "
            "(bf16/fp16 tensor with fp32 accumulate, dense)",
            fp16_tflops=165.2,
            aliases=("4090", "rtx-4090"),
            memory_gb=24,
        ),
        Chip(
            "Apple M2",
            100,
            None,
            3.6,
            "Apple newsroom 'Apple unveils M2' (June 2022): 100 GB/s, 3.6 TFLOPS GPU",
            aliases=("m2",),
            memory_gb=24,
        ),
        Chip(
            "Apple M2 Max",
            400,
            None,
            13.6,
            "Apple newsroom 'M2 Pro and M2 Max' (Jan 2023): 400 GB/s, 13.6 TFLOPS GPU",
            aliases=("m2-max",),
            memory_gb=96,
        ),
        Chip(
            "Apple M3 Max",
            400,
            None,
            14.2,
            "Apple M3 Max spec page: 400 GB/s (16-core CPU variant); fp32 derived, "
            "not published: 40 GPU cores x 128 lanes x 2 FLOP x ~1.39 GHz",
            aliases=("m3-max",),
            memory_gb=128,
        ),
        Chip(
            "Laptop CPU",
            89.6,
            None,
            0.9,
            "derived, not a datasheet: dual-channel DDR5-5600 = 2 x 8 B x 5600 MT/s; "
            "8 cores x 2 AVX2 FMA x 8 fp32 lanes x 2 FLOP x ~3.5 GHz",
            aliases=("laptop-cpu",),
            memory_gb=16,
        ),
    ]
}


CHIP_ALIASES: dict[str, str] = {a: c.name for c in KNOWN_CHIPS.values() for a in c.aliases}


def chip_named(name: str) -> Chip:
    """A chip of the table by its name ("H100 SXM") or a short name ("h100"); refuses others."""
    key = CHIP_ALIASES.get(str(name).lower(), name)
    if key not in KNOWN_CHIPS:
        known = ", ".join([*CHIP_ALIASES, *KNOWN_CHIPS])
        raise ValueError(f"unknown chip {name!r}; known: {known}")
    return KNOWN_CHIPS[key]


def chip_peaks(name: str, dtype: str = "bfloat16") -> Peaks:
    """Modelled peaks of a known chip for a dtype (vendor figures; nothing measured)."""
    chip = chip_named(name)
    key = chip_dtype(dtype)
    return Peaks(
        device=chip.name,
        dtype=key,
        bandwidth_gbps=chip.bandwidth_gbps,
        flops=chip.tflops(key) * 1e12,
        method="modelled",
        details={"source": chip.source, "memory_gb": chip.memory_gb},
    )


# --- measuring this machine ------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeSizes:
    """Sizes and repeats of one measurement."""

    buffer_bytes: int
    matmul_n: int
    repeats: int  # matmul repeats
    warmup: int = 1
    bandwidth_repeats: int = (
        15  # copies and reads are short: many repeats, so the best one finds a quiet moment
    )


def _plan(device: torch.device, thorough: bool) -> ProbeSizes:
    if device.type == "cuda":
        return ProbeSizes(
            buffer_bytes=(2 << 30) if thorough else (512 << 20),
            matmul_n=8192 if thorough else 4096,
            repeats=20 if thorough else 10,
            bandwidth_repeats=30 if thorough else 15,
        )
    return ProbeSizes(
        buffer_bytes=(512 << 20) if thorough else (128 << 20),
        matmul_n=2048 if thorough else 1024,
        repeats=9 if thorough else 5,
        bandwidth_repeats=25 if thorough else 15,
    )


def last_level_cache_bytes(device: torch.device) -> int | None:
    """Size of the last-level cache: L2 on CUDA, the highest-level CPU cache from sysfs elsewhere."""
    if device.type == "cuda":
        return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)) or None
    base = "/sys/devices/system/cpu/cpu0/cache"
    best = (0, None)
    try:
        for entry in sorted(os.listdir(base)):
            if not entry.startswith("index"):
                continue
            level = int(open(f"{base}/{entry}/level").read())
            kind = open(f"{base}/{entry}/type").read().strip()
            size = open(f"{base}/{entry}/size").read().strip()
            if kind in ("Unified", "Data") and level >= best[0]:
                mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1], 1)
                best = (level, int(size.rstrip("KMG")) * mult)
    except (OSError, ValueError):
        return None
    return best[1]


def _rates(work: float, m: Measurement) -> tuple[float, float]:
    """(median rate, best rate) of `work` units per repeat."""
    return work / m.median, work / m.low


def _copy_gbps(
    nbytes: int, device: torch.device, plan: ProbeSizes
) -> tuple[float, float, Measurement]:
    n = nbytes // 4
    src = torch.ones(n, device=device)
    dst = torch.zeros(n, device=device)  # touch every page before timing
    m = time_repeats(
        lambda: dst.copy_(src), device, repeats=plan.bandwidth_repeats, warmup=plan.warmup
    )
    return *_rates(2 * n * 4 / GB, m), m  # read + write


def _read_gbps(
    nbytes: int, device: torch.device, plan: ProbeSizes
) -> tuple[float, float, Measurement]:
    n = nbytes // 4 // 1024 * 1024
    src = torch.ones(n // 1024, 1024, device=device)  # [rows, 1024]
    x = torch.ones(1024, device=device)
    m = time_repeats(
        lambda: torch.mv(src, x), device, repeats=plan.bandwidth_repeats, warmup=plan.warmup
    )
    return *_rates(n * 4 / GB, m), m


def _square(n: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cpu").manual_seed(0)
    return tuple(torch.randn(n, n, generator=gen).to(device=device, dtype=dtype) for _ in range(2))


def _matmul_size(n: int, dtype: torch.dtype, device: torch.device, budget_s: float) -> int:
    """Shrink the planned size for dtypes this device runs slowly (e.g. fp16 on a CPU without fp16
    units) so one matmul takes about budget_s: time one 256^3 probe first."""
    a, b = _square(256, dtype, device)
    _, seconds = time_call(lambda: a @ b, device)
    rate = 2.0 * 256**3 / max(seconds, 1e-9)
    fit = int((rate * budget_s / 2.0) ** (1 / 3)) // 64 * 64
    return max(256, min(n, fit))


SKINNY = (
    (16, 2048, 2048),
    (128, 1024, 1024),
)  # (M, K, N): nn.Linear products of batched decode steps
MATVEC_SHAPE = (2048, 4096)  # [N, K]: a B=1 decode step's kernel


def _kernel_rates(
    dtype: torch.dtype, device: torch.device, plan: ProbeSizes
) -> dict[str, tuple[float, float, Measurement]]:
    """FLOP/s of the skinny products decode runs: a matrix-vector product and [M, K] x [K, N] for small M.
    On a CPU without half-precision matrix units these can outrun the square matmul for bf16/fp16 by
    several times, so the peak takes the best of all of them (a lower bound must not be beaten)."""
    gen = torch.Generator(device="cpu").manual_seed(1)
    out = {}
    w = torch.randn(*MATVEC_SHAPE, generator=gen).to(device=device, dtype=dtype)
    x = torch.randn(MATVEC_SHAPE[1], generator=gen).to(device=device, dtype=dtype)
    m = time_repeats(
        lambda: torch.mv(w, x), device, repeats=max(plan.repeats, 5), warmup=plan.warmup
    )
    out[f"mv {MATVEC_SHAPE[0]}x{MATVEC_SHAPE[1]}"] = (
        *_rates(2.0 * MATVEC_SHAPE[0] * MATVEC_SHAPE[1], m),
        m,
    )
    for M, K, N in SKINNY:
        a = torch.randn(M, K, generator=gen).to(device=device, dtype=dtype)
        b = torch.randn(N, K, generator=gen).to(
            device=device, dtype=dtype
        )  # [out, in], as nn.Linear stores it
        m = time_repeats(
            lambda: torch.nn.functional.linear(a, b),  # noqa: B023 - called at once, in this iteration
            device,
            repeats=max(plan.repeats, 5),
            warmup=plan.warmup,
        )
        out[f"linear {M}x{K}x{N}"] = (*_rates(2.0 * M * K * N, m), m)
    return out


def _matmul_flops(
    n: int, dtype: torch.dtype, device: torch.device, plan: ProbeSizes
) -> tuple[float, float, Measurement]:
    a, b = _square(n, dtype, device)
    m = time_repeats(lambda: a @ b, device, repeats=plan.repeats, warmup=plan.warmup)
    return *_rates(2.0 * n**3, m), m


def load_average() -> list[float] | None:
    """1/5/15-minute load average: on a shared machine, other work slows every figure."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


_BANDWIDTH: dict[tuple, dict[str, Any]] = {}
_PEAKS: dict[tuple, Peaks] = {}


def _bandwidth(device: torch.device, plan: ProbeSizes, thorough: bool) -> dict[str, Any]:
    key = (str(device), torch.get_num_threads(), thorough)
    if key not in _BANDWIDTH:
        copy, copy_best, m_copy = _copy_gbps(plan.buffer_bytes, device, plan)
        read, read_best, m_read = _read_gbps(plan.buffer_bytes, device, plan)
        llc = last_level_cache_bytes(device)
        cache = None
        if llc and llc // 4 >= (
            1 << 20
        ):  # best of many short repeats: a cache-resident working set
            small = ProbeSizes(llc // 4, 0, repeats=10, bandwidth_repeats=10)
            cache = max(
                _copy_gbps(small.buffer_bytes, device, small)[1],
                _read_gbps(small.buffer_bytes, device, small)[1],
            )
        _BANDWIDTH[key] = {
            "copy_gbps": copy,
            "read_gbps": read,
            "best_gbps": max(copy_best, read_best),
            "cache_gbps": cache,
            "cache_bytes": llc,
            "copy": m_copy.to_dict(),
            "read": m_read.to_dict(),
        }
    return _BANDWIDTH[key]


def measure(
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "float32",
    *,
    thorough: bool = False,
) -> Peaks:
    """Measured peaks of `device` for `dtype` (cached per process, device, dtype and thread count)."""
    dev = resolve_device(device)
    name = dtype_name(dtype)
    key = (str(dev), name, torch.get_num_threads(), thorough)
    if key in _PEAKS:
        return _PEAKS[key]
    plan = _plan(dev, thorough)
    bw = _bandwidth(dev, plan, thorough)
    slow = (
        dev.type == "cpu" and name != "float32" and not thorough
    )  # half types may be emulated on a CPU
    n = _matmul_size(plan.matmul_n, getattr(torch, name), dev, 0.1) if slow else plan.matmul_n
    flops, flops_best, m_mm = _matmul_flops(n, getattr(torch, name), dev, plan)
    kernels = {
        f"mm {n}x{n}x{n}": (flops, flops_best, m_mm),
        **_kernel_rates(getattr(torch, name), dev, plan),
    }
    details = {
        "buffer_bytes": plan.buffer_bytes,
        "matmul_n": n,
        "repeats": plan.repeats,
        "bandwidth_repeats": plan.bandwidth_repeats,
        "warmup": plan.warmup,
        "threads": torch.get_num_threads(),
        "timer": m_mm.method,
        "statistic": "median",
        "thorough": thorough,
        "copy": bw["copy"],
        "read": bw["read"],
        "matmul": m_mm.to_dict(),
        "kernel_flops": {k: v[0] for k, v in kernels.items()},
        "kernel_flops_best": {k: v[1] for k, v in kernels.items()},
        "torch": torch.__version__,
        "load_average": load_average(),
    }
    if dev.type == "cuda":
        details["gpu"] = torch.cuda.get_device_name(dev)
    peaks = Peaks(
        device=str(dev),
        dtype=name,
        bandwidth_gbps=max(bw["copy_gbps"], bw["read_gbps"]),
        flops=max(v[0] for v in kernels.values()),
        method="measured",
        copy_gbps=bw["copy_gbps"],
        read_gbps=bw["read_gbps"],
        cache_gbps=bw["cache_gbps"],
        cache_bytes=bw["cache_bytes"],
        bound_gbps=bw["best_gbps"],
        bound_flops=max(v[1] for v in kernels.values()),
        details=details,
    )
    _PEAKS[key] = peaks
    return peaks
