"""Weights in another precision: fp32 / bf16 / fp16 casts, int8 and int4 weight quantisation through
real libraries (never a home-made quantiser), and what the weights really hold afterwards.

    quantize(model, kind, backend, device) -> the model with quantised weights (in place)
    weight_inventory(model)           -> parameter count, bytes, and bytes per matmul weight by part

explorer.model.loader.with_weights(lm, "int8") builds a converted LoadedModel from these.

Backends, chosen per device unless named ("int8:torchao", "int8:fbgemm"):

    int8 on CPU   torch's fbgemm kernels: torch.ao.quantization.quantize_dynamic(model, {nn.Linear},
                  per-channel qint8). Weights int8 with one scale and zero point per output row;
                  activations quantised on the fly per call. Deprecated by torch in favour of
                  torchao, but its CPU kernels are the fast ones on this kind of machine.
    int8 on CUDA  torchao quantize_(model, Int8WeightOnlyConfig()).
    int8:torchao  the same torchao config on any device (on CPU its kernels can be far slower than
                  fp32: the same idea, another kernel; the ladder shows both).
    int4          torchao quantize_(model, Int4WeightOnlyConfig()); needs a CUDA GPU (on CPU
                  torchao 0.18 needs the separate `mslk` kernel package). torchao is the optional
                  extra `pip install -e '.[quant]'`.

Every nn.Linear is quantised, the LM head included; the token embedding stays in the model dtype
(with tied embeddings the int8 model therefore holds the embedding plus an int8 copy of the head:
ModelInfo counts both). GPT-2's attention and MLP are Conv1D, not nn.Linear: the fbgemm path leaves
them as they are and the inventory says so (their bytes per weight stay those of the dtype).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from explorer._dtypes import DTYPES, MODEL_DTYPES
from explorer.model.device import dtype_name, dtype_problem

# the rows of explorer._dtypes a model's weights may be in, by short name
WEIGHTS = tuple(d.short for d in DTYPES if d.name != "fp8")  # fp32, bf16, fp16, int8, int4
BACKENDS = {"int8": ("fbgemm", "torchao"), "int4": ("torchao",)}
FLOAT_WEIGHTS = {d.short: d.name for d in MODEL_DTYPES}  # "fp32" -> "float32"
SHORT = {d.name: d.short for d in MODEL_DTYPES}  # "float32" -> "fp32"


class WeightsNotSupportedError(ValueError):
    """A weights setting this device or this install cannot run; the message names both and why."""


def parse_weights(weights: str) -> tuple[str, str | None]:
    """ "int8" -> ("int8", None); "int8:torchao" -> ("int8", "torchao"); "bf16" -> ("bf16", None)."""
    if not isinstance(weights, str):
        raise ValueError(f"weights must be one of {WEIGHTS} (a string), got {weights!r}")
    kind, _, backend = weights.strip().lower().partition(":")
    kind = SHORT.get(kind, kind)  # "float32" -> "fp32"
    if kind not in WEIGHTS:
        raise ValueError(f"unknown weights {weights!r}; use one of {', '.join(WEIGHTS)}")
    if backend and backend not in BACKENDS.get(kind, ()):
        known = BACKENDS.get(kind, ())
        raise ValueError(
            f"weights {kind} has no backend {backend!r}; "
            + (f"use one of {', '.join(known)}" if known else "it takes no backend")
        )
    return kind, backend or None


def weights_of(dtype: str) -> str:
    """The weights name of an unquantised model of this dtype: "float32" -> "fp32"."""
    return SHORT.get(dtype_name(dtype), dtype_name(dtype))


def default_backend(kind: str, device: torch.device) -> str | None:
    if kind == "int8":
        return "fbgemm" if device.type == "cpu" else "torchao"
    return "torchao" if kind == "int4" else None


def check_dtype_runs(device: torch.device, dtype: torch.dtype) -> None:
    """Raise WeightsNotSupportedError (naming device and dtype) when a small matmul cannot run."""
    why = dtype_problem(device, dtype)
    if why:
        raise WeightsNotSupportedError(why)


def quantize(model: nn.Module, kind: str, backend: str, device: torch.device) -> nn.Module:
    if backend == "fbgemm":
        if device.type != "cpu":
            raise WeightsNotSupportedError(
                f"the fbgemm int8 path runs on CPU only, not on {device}; use int8:torchao"
            )
        if "fbgemm" not in torch.backends.quantized.supported_engines:
            raise WeightsNotSupportedError(
                "this torch build has no fbgemm quantized engine "
                f"(engines: {torch.backends.quantized.supported_engines}); use int8:torchao"
            )
        import warnings

        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its deprecation notice: we say why we use it above
            return quantize_dynamic(model, {nn.Linear: per_channel_dynamic_qconfig}, inplace=True)
    return _torchao(model, kind, device)


def _torchao(model: nn.Module, kind: str, device: torch.device) -> nn.Module:
    if kind == "int4" and device.type != "cuda":
        raise WeightsNotSupportedError(
            f"int4 weights are not supported on {device} here: torchao's Int4WeightOnlyConfig "
            "has CUDA kernels (on CPU it needs the separate `mslk` package) and torch's own fbgemm "
            "path has no int4 linear. Use int8, or a CUDA GPU."
        )
    logger = logging.getLogger("torchao")
    if logger.level == logging.NOTSET:  # its CUDA-only extensions fail to load on CPU: noise
        logger.setLevel(logging.ERROR)
    try:
        from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_
    except ImportError as err:
        raise WeightsNotSupportedError(
            f"{kind} weights through torchao need the torchao package, which is not installed: "
            "`pip install -e '.[quant]'` (or `pip install torchao`)"
        ) from err
    config = Int8WeightOnlyConfig() if kind == "int8" else Int4WeightOnlyConfig()
    try:
        quantize_(model, config)
    except Exception as err:  # noqa: BLE001  (the library's reason, named)
        raise WeightsNotSupportedError(
            f"torchao could not quantise to {kind} on {device}: {str(err).splitlines()[0]}"
        ) from err
    return model


# --- what the weights hold -------------------------------------------------------------------------


def tensor_bytes(t: torch.Tensor) -> int:
    """Real bytes of a tensor: quantized tensors count their int values plus scales and zero points;
    tensor subclasses (torchao) the tensors they are made of."""
    if t.is_quantized:
        n = t.numel() * t.element_size()  # 1 byte per qint8
        if t.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
            s, z = t.q_per_channel_scales(), t.q_per_channel_zero_points()
            return n + s.numel() * s.element_size() + z.numel() * z.element_size()
        return n + 8 + 8  # one double scale, one int64 zero point
    flatten = getattr(type(t), "__tensor_flatten__", None)
    if flatten is not None and type(t) not in (torch.Tensor, nn.Parameter):
        names, _ = t.__tensor_flatten__()
        return sum(tensor_bytes(getattr(t, n)) for n in names)
    return t.numel() * t.element_size()


def _dynamic_linear(module: nn.Module) -> bool:
    return callable(getattr(module, "weight", None)) and hasattr(module, "_packed_params")


def _unpacked(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A dynamic quantized Linear's (weight, bias), unpacked once: its weight() and bias() each
    unpack both (fbgemm's linear_unpack copies the matrix; a 0.5B model took seconds per call)."""
    return module._weight_bias()


def _linear_weight(module: nn.Module, unpacked: dict | None = None) -> torch.Tensor | None:
    """The weight of a matmul module (nn.Linear, a dynamic quantized Linear, GPT-2's Conv1D);
    `unpacked` (id -> (weight, bias)) holds quantized modules already unpacked."""
    if _dynamic_linear(module):
        got = (unpacked or {}).get(id(module))
        return (got or _unpacked(module))[0]
    if isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D":
        return module.weight
    return None


def weight_inventory(model: nn.Module) -> dict:
    """What the model's weights really hold: {"parameters", "bytes", "linear_bytes": {part: bytes per
    matmul weight value}}; parts are "attention", "mlp", "lm_head" (from explorer.model.layout).

    Parameters are counted once (tied weights once); a quantized Linear's packed weight and bias are
    counted too, although they are not nn.Parameters."""
    seen: set[int] = set()
    count = nbytes = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            count += p.numel()
            nbytes += tensor_bytes(p)
    unpacked = {id(m): _unpacked(m) for m in model.modules() if _dynamic_linear(m)}
    for w, b in unpacked.values():
        count += w.numel() + (b.numel() if b is not None else 0)
        nbytes += tensor_bytes(w) + (tensor_bytes(b) if b is not None else 0)
    return {"parameters": count, "bytes": nbytes, "linear_bytes": _linear_bytes(model, unpacked)}


def _linear_bytes(model: nn.Module, unpacked: dict | None = None) -> dict[str, float] | None:
    from explorer.model.layout import LayoutError, layout

    try:
        lay = layout(model)
    except LayoutError:
        return None
    groups = {
        "attention": [layer.attention for layer in lay.layers],
        "mlp": [layer.mlp for layer in lay.layers],
        "lm_head": [lay.lm_head],
    }
    out = {}
    for part, roots in groups.items():
        n = b = 0
        for root in roots:
            for m in root.modules():
                w = _linear_weight(m, unpacked)
                if w is not None:
                    n += w.numel()
                    b += tensor_bytes(w)
        if n:
            out[part] = b / n
    return out
