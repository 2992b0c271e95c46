"""Memory checked before it is spent: modelled bytes against what the device has free.

    check_fits(need_bytes, device, "the weights of arch:llama-3.1-8b (float32)", offer="...")
    check_arch_fits("arch:llama-3.1-8b", device, torch.float32)   # before load() allocates

Each refusal is one line naming both numbers and, where there is one, what would fit. The
numbers are modelled (weights: unique parameters x bytes per value; a cache: positions x bytes
per position); what is free comes from explorer.model.device.available_bytes.
"""

from __future__ import annotations

import torch

from explorer.model import device as _device

HEADROOM = 0.9  # refuse what would take more than this share of the free memory


class NotEnoughMemory(ValueError):
    """A run or a model that would not fit the memory available (the message names both)."""


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def fits(need: float, device) -> bool:
    free = _device.available_bytes(device)
    return free is None or need <= HEADROOM * free


def check_fits(need: float, device, what: str, offer: str = "") -> None:
    """NotEnoughMemory when `need` bytes would not fit what `device` has free (None: no check)."""
    free = _device.available_bytes(device)
    if free is None or need <= HEADROOM * free:
        return
    raise NotEnoughMemory(
        f"{what}: {gib(need)} needed (modelled), {torch.device(device)} has {gib(free)} "
        "available" + (f"; {offer}" if offer else "")
    )


def check_arch_fits(name: str, device, dtype: torch.dtype) -> None:
    """Before an architecture-only shape is built: its weights in `dtype` must fit."""
    from explorer.model.loader import arch_info

    need = arch_info(name, _device.dtype_name(dtype)).weight_bytes
    if fits(need, device):
        return
    check_fits(
        need,
        device,
        f"the weights of {name} ({_device.dtype_name(dtype)})",
        _offer(name, device, dtype),
    )


def _offer(name: str, device, dtype: torch.dtype) -> str:
    """A smaller dtype of the same shape, else the shapes that fit in this dtype."""
    from explorer.model.loader import arch_info, available_models

    for smaller in ("bfloat16",):
        if dtype.itemsize > 2 and fits(arch_info(name, smaller).weight_bytes, device):
            return f"--dtype {smaller} ({gib(arch_info(name, smaller).weight_bytes)}) fits"
    names = [m for m in available_models() if m.startswith("arch:") and m != name]
    ok = [m for m in names if fits(arch_info(m, _device.dtype_name(dtype)).weight_bytes, device)]
    return (
        f"shapes that fit in {_device.dtype_name(dtype)}: {', '.join(ok)}"
        if ok
        else "no architecture shape fits; try bundled:target"
    )
