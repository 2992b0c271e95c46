"""What runs: load() -> LoadedModel (+ ModelInfo), bundled and architecture-only shapes, devices and dtypes."""

from explorer.model.device import (
    DTYPES,
    DeviceNotAvailableError,
    available_bytes,
    devices_here,
    dtype_bytes,
    dtype_name,
    is_out_of_memory,
    resolve_device,
    resolve_dtype,
)
from explorer.model.loader import (
    ARCH_DIR,
    MODELS_DIR,
    LoadedModel,
    ModelInfo,
    ModelNotFoundError,
    arch_config,
    arch_info,
    available_models,
    load,
    model_info,
)

__all__ = [
    "ARCH_DIR",
    "DTYPES",
    "MODELS_DIR",
    "DeviceNotAvailableError",
    "LoadedModel",
    "ModelInfo",
    "ModelNotFoundError",
    "arch_config",
    "arch_info",
    "available_bytes",
    "available_models",
    "devices_here",
    "dtype_bytes",
    "dtype_name",
    "is_out_of_memory",
    "load",
    "model_info",
    "resolve_device",
    "resolve_dtype",
]
