"""The settings of one training run: the models' shapes, the optimiser's settings, the run's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from scripts.train_moe import MOE_SPEC, MoeSpec

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "assets" / "models"
ALL_MODELS = ("target", "draft", "moe")

TARGET_PROMPTS: tuple[str, ...] = (
    "The return statement",
    "A list comprehension",
    "Return a new",
    "The with statement",
)
DRAFT_PROMPTS: tuple[str, ...] = ("The return statement", "Return a new")


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of one Llama model (all other settings are Llama defaults)."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_position_embeddings: int = 512


@dataclass(frozen=True)
class TrainSettings:
    """Optimisation settings for one model."""

    steps: int
    batch_size: int = 8
    seq_len: int = 256
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    eval_every: int = 100
    seed: int = 1234

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len


@dataclass(frozen=True)
class RunSettings:
    """Everything one invocation of the script needs."""

    out_dir: Path
    vocab_size: int
    val_fraction: float
    seed: int
    target: ModelSpec
    draft: ModelSpec
    target_train: TrainSettings
    draft_train: TrainSettings
    moe: MoeSpec = MOE_SPEC
    moe_train: TrainSettings | None = None
    only: tuple[str, ...] = ALL_MODELS  # the models this run trains; the others' records stay
    max_new_tokens: int = 24
    command: str = "python scripts/train_bundled.py"


TARGET_SPEC = ModelSpec(
    "target", hidden_size=256, num_layers=6, num_heads=8, num_kv_heads=4, intermediate_size=768
)
DRAFT_SPEC = ModelSpec(
    "draft", hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=384
)
