"""The training loop: AdamW, warm-up then cosine, shuffled epochs, the best checkpoint kept."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import torch
from transformers import LlamaForCausalLM

from scripts.bundled.settings import TrainSettings
from scripts.train_moe import is_moe


def learning_rate(step: int, s: TrainSettings) -> float:
    """Linear warmup, then cosine decay to ``min_lr_ratio * lr``."""
    if step < s.warmup_steps:
        return s.lr * (step + 1) / s.warmup_steps
    progress = (step - s.warmup_steps) / max(1, s.steps - s.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return s.lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * cosine)


def make_optimizer(model: torch.nn.Module, s: TrainSettings) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on norms)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": s.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=s.lr, betas=s.betas, eps=1e-8)


def batch_indices(num_rows: int, s: TrainSettings) -> Iterator[torch.Tensor]:
    """Row indices per step: shuffled epochs from a seeded generator."""
    gen = torch.Generator().manual_seed(s.seed)
    order = torch.empty(0, dtype=torch.long)
    while True:
        if order.numel() < s.batch_size:
            order = torch.cat([order, torch.randperm(num_rows, generator=gen)])
        yield order[: s.batch_size]
        order = order[s.batch_size :]


@torch.no_grad()
def evaluate(model: LlamaForCausalLM, rows: torch.Tensor, batch_size: int = 32) -> float:
    """Mean next-token cross-entropy (nats) over all validation rows."""
    model.eval()
    total, count = 0.0, 0
    for start in range(0, rows.shape[0], batch_size):
        batch = rows[start : start + batch_size]
        kw = {"output_router_logits": False} if is_moe(model) else {}  # the LM loss alone
        loss = model(input_ids=batch, labels=batch, **kw).loss
        n = batch.shape[0] * (batch.shape[1] - 1)
        total += loss.item() * n
        count += n
    model.train()
    return total / count


def train_model(
    model: LlamaForCausalLM, train_rows: torch.Tensor, val_rows: torch.Tensor, s: TrainSettings
) -> dict[str, Any]:
    """Train in place; returns a summary with losses and timings."""
    torch.manual_seed(s.seed)
    start = time.perf_counter()
    history, best = _train_steps(model, train_rows, val_rows, s, start)
    wall = time.perf_counter() - start
    if best["step"] != s.steps:  # validation loss went up again: keep the best checkpoint
        print(f"  restoring best checkpoint from step {best['step']}", flush=True)
        model.load_state_dict(best["state"])
    stride = max(1, train_rows.shape[0] // val_rows.shape[0])
    final_train = evaluate(model, train_rows[::stride])  # as many rows as validation
    return _training_summary(s, train_rows.shape[0], history, best, wall, final_train)


def _train_steps(
    model: LlamaForCausalLM,
    train_rows: torch.Tensor,
    val_rows: torch.Tensor,
    s: TrainSettings,
    start: float,
) -> tuple[list[dict[str, float]], dict[str, Any]]:
    """The optimisation loop: (the validation history, the best checkpoint seen)."""
    optimizer = make_optimizer(model, s)
    batches = batch_indices(train_rows.shape[0], s)
    history: list[dict[str, float]] = []
    recent: list[float] = []
    best: dict[str, Any] = {"val_loss": math.inf, "step": 0, "state": None}
    model.train()
    for step in range(s.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, s)
        batch = train_rows[next(batches)]
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
        optimizer.step()
        recent = (recent + [loss.item()])[-20:]
        if (step + 1) % s.eval_every == 0 or step + 1 == s.steps:
            val = evaluate(model, val_rows)
            elapsed = time.perf_counter() - start
            history.append(
                {
                    "step": step + 1,
                    "train_loss": sum(recent) / len(recent),
                    "val_loss": val,
                    "elapsed_s": round(elapsed, 1),
                }
            )
            print(
                f"  step {step + 1:5d}/{s.steps}  train {history[-1]['train_loss']:.3f}  "
                f"val {val:.3f}  ppl {math.exp(val):7.1f}  lr {learning_rate(step, s):.2e}  "
                f"{elapsed / (step + 1):.2f}s/step",
                flush=True,
            )
            if val < best["val_loss"]:
                best = {
                    "val_loss": val,
                    "step": step + 1,
                    "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
                }
    return history, best


def _training_summary(
    s: TrainSettings,
    num_rows: int,
    history: list[dict[str, float]],
    best: dict[str, Any],
    wall: float,
    final_train: float,
) -> dict[str, Any]:
    """The model's record in training.json."""
    final_val = best["val_loss"]
    return {
        "steps": s.steps,
        "batch_size": s.batch_size,
        "seq_len": s.seq_len,
        "tokens_per_step": s.tokens_per_step,
        "tokens_seen": s.steps * s.tokens_per_step,
        "epochs": round(s.steps * s.batch_size / num_rows, 2),
        "optimizer": {
            "name": "AdamW",
            "lr": s.lr,
            "betas": list(s.betas),
            "weight_decay": s.weight_decay,
            "grad_clip": s.grad_clip,
            "schedule": f"linear warmup {s.warmup_steps} steps, cosine to {s.min_lr_ratio} x lr",
        },
        "seed": s.seed,
        "wall_time_s": round(wall, 1),
        "seconds_per_step": round(wall / s.steps, 3),
        "saved_checkpoint_step": best["step"],
        "final_train_loss_running": round(history[-1]["train_loss"], 4),
        "final_train_loss": round(final_train, 4),
        "final_val_loss": round(final_val, 4),
        "final_val_perplexity": round(math.exp(final_val), 2),
        "final_train_perplexity": round(math.exp(final_train), 2),
        "history": [
            {k: round(v, 4) if isinstance(v, float) else v for k, v in h.items()} for h in history
        ],
    }
