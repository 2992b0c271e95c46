"""How `explorer app` serves the dashboard: AppConfig (validated on construction) and the shared-mode allow-list.

AppConfig(port=8866, shared=True, models_config="models.json")   bad values raise ValueError
read_models_config(path)                                           the allow-list of model names
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from explorer.app.voila.sharing import kernel_threads


@dataclass
class AppConfig:
    """How `explorer app` serves the dashboard. Validated on construction (bad values raise ValueError)."""

    port: int = 8866
    ip: str = "127.0.0.1"
    shared: bool = False  # classroom mode: allow-listed models only, capacity printed
    models_config: Path | None = (
        None  # JSON allow-list for shared mode ({"models": [...]} or [...])
    )
    pool_size: int = 1  # preheated kernels kept ready (0 = no preheating)
    cull_idle_timeout: int = (
        120  # seconds a kernel with no open tab may idle before it is reclaimed
    )
    cull_interval: int = 0  # seconds between culler passes (0 = derived: timeout / 4, 1..30)
    refill_delay: float = (
        8.0  # seconds after a visitor takes a preheated kernel before its replacement starts
    )
    #   (its start-up would otherwise compete for the CPU with that visitor's first render: 3 s -> 10 s here)
    open_browser: bool = True
    threads: int = 0  # torch CPU threads per kernel (0 = derived from the cores and the pool size:
    #   sharing.THREADS_RULE, max(1, (cores - 1) // pool size); see kernel_env)
    notebook: Path | None = None  # default: notebooks/dashboard.ipynb (generated if not installed)
    models: list[str] = field(
        default_factory=list
    )  # derived: the allow-list read from models_config

    def __post_init__(self) -> None:
        for name in ("port", "pool_size", "cull_idle_timeout", "cull_interval"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if not 1 <= self.port <= 65535:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        if not 0 <= self.pool_size <= 32:
            raise ValueError(f"pool size must be in 0..32, got {self.pool_size}")
        if self.cull_idle_timeout < 1:
            raise ValueError(
                f"cull idle timeout must be at least 1 s, got {self.cull_idle_timeout}"
            )
        if self.cull_interval < 0:
            raise ValueError(f"cull interval must be >= 0 s, got {self.cull_interval}")
        if not isinstance(self.refill_delay, (int, float)) or not 0 <= self.refill_delay <= 600:
            raise ValueError(f"refill delay must be 0..600 s, got {self.refill_delay!r}")
        if not isinstance(self.threads, int) or isinstance(self.threads, bool) or self.threads < 0:
            raise ValueError(
                f"threads must be a whole number >= 0 (0 = from the cores and the pool size), "
                f"got {self.threads!r}"
            )
        if self.threads == 0:
            self.threads = kernel_threads(os.cpu_count(), self.pool_size)
        if self.cull_interval == 0:
            self.cull_interval = max(1, min(30, self.cull_idle_timeout // 4))
        if self.models_config is not None:
            if not self.shared:
                raise ValueError("--models-config only applies with --shared")
            self.models_config = Path(self.models_config).expanduser().resolve()
            self.models = read_models_config(self.models_config)
        if self.notebook is not None:
            self.notebook = Path(self.notebook).expanduser().resolve()
            if not self.notebook.is_file():
                raise ValueError(f"notebook not found: {self.notebook}")

    @property
    def url(self) -> str:
        return f"http://{self.ip}:{self.port}/"


def read_models_config(path: Path) -> list[str]:
    """The allow-list of model names in a JSON file: {"models": ["bundled:target", ...]} or a bare list."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"models config not found: {path}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"models config {path} is not valid JSON: {err}") from None
    models = data.get("models") if isinstance(data, dict) else data
    if (
        not isinstance(models, list)
        or not models
        or not all(isinstance(m, str) and m.strip() for m in models)
    ):
        raise ValueError(
            f"models config {path} must hold a non-empty list of model names, "
            'e.g. {"models": ["bundled:target", "bundled:draft"]}'
        )
    return [m.strip() for m in models]
