"""Memory checked before it is spent: modelled bytes against what the device has free.

    check_fits(need_bytes, device, "the weights of arch:llama-3.1-8b (float32)", offer="...")

The loader checks an architecture-only shape's weights with it before building them. Each refusal
is one line naming both numbers and, where there is one, what would fit. The
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
