"""Which models the dashboard offers and the ones it holds loaded.

    models = ModelCache(shared=False, allowed=[])
    models.names(current)           # the dropdown's choices (the allow-list on a shared server)
    models.load("bundled:target")   # loaded once, kept; a big model is dropped when another is loaded

Shared mode (a classroom server): only the allow-list is offered. When the dashboard is not told,
shared mode and the allow-list come from the environment: EXPLORER_SHARED=1 and
EXPLORER_MODELS_CONFIG=<path to JSON> holding {"models": ["bundled:target", ...]} or a bare list
(the format `explorer app --shared` writes).
"""

from __future__ import annotations

import os

from explorer.model.device import resolve_device, resolve_dtype
from explorer.model.loader import LoadedModel, available_models, load

# A rough load rate for the "how long" of a model switch, before this process has timed one:
# reading and building weights on a small CPU machine (a 0.5B-parameter bf16 model took ~25 s).
ROUGH_LOAD_BYTES_PER_S = 50e6
KEEP_PREFIX = "bundled:"  # small models kept loaded when another is loaded


class ModelCache:
    """The loaded models by name, the allow-list, and each load's measured time."""

    def __init__(self, shared: bool | None = None, allowed: list[str] | None = None):
        self.shared, self.allowed = shared_config(shared, allowed)
        self.loaded: dict[str, LoadedModel] = {}
        self.load_s: dict[str, float] = {}  # name -> seconds its load took here

    def add(self, lm: LoadedModel) -> None:
        self.loaded[lm.info.name] = lm

    def default(self) -> str:
        return self.allowed[0] if self.allowed else "bundled:target"

    def names(self, current: str | None = None) -> list[str]:
        """The models offered: the allow-list, else every bundled / architecture / cached model
        (plus `current` when it was typed as a hub id or path and is loaded)."""
        names = list(self.allowed) if self.allowed else available_models()
        if current and current not in names and not self.shared and current in self.loaded:
            names.append(current)
        return names

    def check_offered(self, name: str) -> None:
        if self.shared and self.allowed and name not in self.allowed:
            raise ValueError(
                f"{name!r} is not offered on this server; choose one of {', '.join(self.allowed)}"
            )

    def load(self, name: str) -> LoadedModel:
        """The model `name`, loaded once (MemoryError with a clear message if it cannot fit)."""
        if name in self.loaded:
            return self.loaded[name]
        import time

        check_fits(name)
        t0 = time.perf_counter()
        lm = load_quietly(name)
        self.load_s[name] = time.perf_counter() - t0
        keep = {k: v for k, v in self.loaded.items() if k.startswith(KEEP_PREFIX)}
        self.loaded = {**keep, name: lm}  # drop the big models we left
        return lm

    def rough_load_s(self, name: str) -> float | None:
        """About how long loading `name` takes: its last load here, else its weights over a rough
        rate (None when unknown, e.g. a hub id not yet downloaded)."""
        if name in self.load_s:
            return self.load_s[name]
        if name.startswith("arch:"):
            from explorer.model.loader import arch_info

            try:
                info = arch_info(name, "bfloat16")
            except Exception:  # noqa: BLE001 - only an estimate
                return None
            return max(2.0, info.weight_bytes / ROUGH_LOAD_BYTES_PER_S)
        return None


def shared_config(shared: bool | None, allowed: list[str] | None) -> tuple[bool, list[str]]:
    """Shared mode and allow-list from the arguments, else EXPLORER_SHARED / EXPLORER_MODELS_CONFIG."""
    if shared is None:
        shared = os.environ.get("EXPLORER_SHARED", "").strip().lower() in ("1", "true", "yes", "on")
    if allowed is None and os.environ.get("EXPLORER_MODELS_CONFIG"):
        from explorer.app.voila.config import read_models_config

        allowed = read_models_config(os.environ["EXPLORER_MODELS_CONFIG"])
    if allowed is not None:
        if (
            not isinstance(allowed, (list, tuple))
            or not allowed
            or not all(isinstance(m, str) for m in allowed)
        ):
            raise ValueError(
                f"allowed_models must be a non-empty list of model names, got {allowed!r}"
            )
        allowed = [m.strip() for m in allowed]
    if shared and not allowed:
        allowed = ["bundled:target", "bundled:draft"]
    return bool(shared), list(allowed or [])


def load_quietly(name: str) -> LoadedModel:
    """load(name) without transformers' 'Loading weights' progress bar (it would print above the app)."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        return load(name)
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def check_fits(name: str) -> None:
    """Refuse (MemoryError with a clear message) a model whose weights would not fit in memory,
    before a byte is read: the loader's own checks (explorer.model.loader), in the app's words."""
    from explorer.model.loader import check_arch_fits, check_pretrained_fits
    from explorer.model.memory import NotEnoughMemory

    if name.startswith("bundled:"):
        return
    dev = resolve_device("auto")
    dtype = resolve_dtype("auto", dev)
    try:
        if name.startswith("arch:"):
            check_arch_fits(name, dev, dtype)
        else:
            check_pretrained_fits(name, dev, dtype, trust_remote_code=False)
    except NotEnoughMemory as err:
        raise MemoryError(
            f"{name} not loaded (out of memory): {err}. The current model is still loaded; "
            "choose a smaller one."
        ) from None
