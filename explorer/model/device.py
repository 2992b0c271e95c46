"""Devices, dtypes and memory: the one place that names them, checks them and asks what is free.

resolve_device("auto" | "cpu" | "cuda" | "cuda:1" | "mps")  -> torch.device (clear error when absent)
resolve_dtype("auto" | "fp32" | "bf16" | ..., device)        -> torch.dtype
dtype_name(torch.bfloat16 | "bf16")                         -> "bfloat16"
dtype_problem(device, dtype)                                -> why a matmul cannot run, or None
available_bytes(device)                                     -> bytes free for new tensors (or None)
is_out_of_memory(err)                                       -> did the allocator run out?
"""

from __future__ import annotations

import torch

from explorer._dtypes import MODEL_DTYPES, torch_dtype

# the names a model's dtype may be given by (the rows of explorer._dtypes)
DTYPES = {n: torch_dtype(d.name) for d in MODEL_DTYPES for n in (d.name, d.short)}
OOM_MARKERS = (
    "out of memory",
    "can't allocate memory",
    "cannot allocate memory",
    "not enough memory",
)


class DeviceNotAvailableError(ValueError):
    """A device name this machine cannot run (the message lists the devices it has)."""


def devices_here() -> list[str]:
    """The device kinds this machine runs: cpu, plus cuda and mps where present."""
    out = ["cpu"]
    if torch.cuda.is_available():
        out.append(
            "cuda"
            if torch.cuda.device_count() == 1
            else f"cuda (0-{torch.cuda.device_count() - 1})"
        )
    if _mps_available():
        out.append("mps")
    return out


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps and mps.is_available())


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """ "auto" picks cuda, then mps, then cpu; a named device must exist here."""
    if str(device) == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps") if _mps_available() else torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise DeviceNotAvailableError(
            f"unknown device {device!r}; devices here: {', '.join(devices_here())} (or 'auto')"
        ) from err
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = (
                "this torch build has no CUDA"
                if torch.version.cuda is None
                else "no CUDA GPU is visible"
            )
            raise DeviceNotAvailableError(
                f"CUDA is not available on this machine ({why}); devices here: "
                f"{', '.join(devices_here())}"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise DeviceNotAvailableError(
                f"{dev} does not exist: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
    if dev.type == "mps" and not _mps_available():
        raise DeviceNotAvailableError(
            f"MPS is not available on this machine; devices here: {', '.join(devices_here())}"
        )
    return dev


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """ "auto": bf16 (or fp16) on CUDA, fp16 on MPS, fp32 on CPU; else a name from DTYPES."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype != "auto":
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(set(DTYPES))} or 'auto'")
        return DTYPES[dtype]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "mps":
        return torch.float16
    return torch.float32


def dtype_name(dtype: str | torch.dtype) -> str:
    """The canonical name: torch.bfloat16 or "bf16" -> "bfloat16"."""
    if isinstance(dtype, torch.dtype):
        return str(dtype).replace("torch.", "")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(set(DTYPES))}")
    return str(DTYPES[dtype]).replace("torch.", "")


def dtype_problem(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the device cannot run a small matmul in this dtype (naming both), or None when it can."""
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        return (
            f"{torch.cuda.get_device_name(device)} ({device}) does not support bfloat16 matmuls; "
            "use fp16 or fp32"
        )
    try:
        a = torch.ones(8, 8, device=device, dtype=dtype)
        (a @ a).sum().item()
    except (RuntimeError, TypeError) as err:
        return f"{device} cannot run {dtype_name(dtype)} matmuls here: {str(err).splitlines()[0]}"
    return None


def dtype_bytes(dtype: str | torch.dtype) -> int:
    return (DTYPES[dtype] if isinstance(dtype, str) else dtype).itemsize


def available_bytes(device: str | torch.device) -> int | None:
    """Memory free for new tensors: cudaMemGetInfo on CUDA; MemAvailable (and any cgroup limit) on CPU."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.mem_get_info(dev)[0]) if torch.cuda.is_available() else None
    if dev.type != "cpu":
        return None
    free = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
    except OSError:
        return None
    try:
        limit, used = (
            open(f"/sys/fs/cgroup/memory.{k}").read().strip() for k in ("max", "current")
        )
        if limit != "max" and free is not None:
            free = min(free, int(limit) - int(used))
    except (OSError, ValueError):
        pass
    return free


def is_out_of_memory(err: BaseException) -> bool:
    """torch.OutOfMemoryError, MemoryError, or a RuntimeError whose text says the allocator failed."""
    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(
        torch.cuda, "OutOfMemoryError", None
    )
    if isinstance(err, MemoryError) or (isinstance(oom_type, type) and isinstance(err, oom_type)):
        return True
    return isinstance(err, RuntimeError) and any(m in str(err).lower() for m in OOM_MARKERS)
