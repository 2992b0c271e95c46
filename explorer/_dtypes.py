"""The one table of dtypes: each a row with its name, short name, other names, bytes per value,
torch dtype and the chip table's FLOP/s field.

    row("bf16").name          -> "bfloat16"      (any name of a row finds it)
    row("half").short         -> "fp16"
    row("fp8").bytes          -> 1
    torch_dtype("fp32")       -> torch.float32   (torch imported only when asked)

The weights (explorer.model.quant), the devices (explorer.model.device), the KV cache
(explorer.costs.kvdtype) and the chip table (explorer.costs.hardware) read these rows; none
spells a dtype's names again. The group-wise integer KV caches add their scales' bytes on top
of the raw bytes here (explorer.costs.kvdtype).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Dtype:
    """One dtype: its canonical name, short name, other names, bytes per value, torch's name for
    it (None where torch has none) and the chip table's FLOP/s field (None: no figure there)."""

    name: str
    short: str
    bytes: float
    torch_name: str | None
    aliases: tuple[str, ...] = ()
    flops_field: str | None = None
    floating: bool = True  # a float type a model may run in (not an integer quantisation)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, self.short, *self.aliases)


DTYPES = (
    Dtype("float32", "fp32", 4, "float32", ("float",), "fp32_tflops"),
    Dtype("bfloat16", "bf16", 2, "bfloat16", (), "bf16_tflops"),
    Dtype("float16", "fp16", 2, "float16", ("half",), "fp16_tflops"),
    Dtype("fp8", "fp8", 1, "float8_e4m3fn", ("float8", "float8_e4m3fn", "e4m3"), "fp8_tflops"),
    Dtype("int8", "int8", 1, "int8", floating=False),
    Dtype("int4", "int4", 0.5, None, floating=False),
)
_BY_NAME = {n: d for d in DTYPES for n in d.names}
MODEL_DTYPES = tuple(d for d in DTYPES if d.floating and d.name != "fp8")  # what a model loads in


def row(dtype: Any) -> Dtype:
    """The row of a dtype by any of its names, or a torch.dtype (ValueError listing the names)."""
    key = str(dtype).replace("torch.", "").strip().lower()
    if key not in _BY_NAME:
        raise ValueError(f"unknown dtype {dtype!r}; the dtypes are {', '.join(_BY_NAME)}")
    return _BY_NAME[key]


def aliases() -> dict[str, str]:
    """{every other name: the canonical name} over the table."""
    return {n: d.name for d in DTYPES for n in d.names if n != d.name}


def torch_dtype(dtype: Any):
    """The torch.dtype of a row (torch imported here, not at this module's import)."""
    import torch

    found = row(dtype)
    if found.torch_name is None:
        raise ValueError(f"torch has no dtype for {found.name}")
    return getattr(torch, found.torch_name)
