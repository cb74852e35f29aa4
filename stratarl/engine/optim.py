"""Layer 5, training engine: the optimizer and its learning-rate schedule.

AdamW with a linear warm-up followed by a constant or cosine schedule, stepped once per training
step (verl steps its scheduler once per `update_actor`, whatever the number of mini-batches). The
AdamW kernel is one of `ADAMW_IMPLS`: the same update, computed one tensor, a list, or one kernel at a time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
from torch.optim.lr_scheduler import LambdaLR


def constant_after_warmup(step: int, *, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """lr multiplier: (step+1)/warmup during warm-up, then 1."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    return 1.0


def cosine_after_warmup(step: int, *, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """lr multiplier: linear warm-up, then r + (1 − r)·½(1 + cos(π·progress)), r = min_lr_ratio."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


LR_SCHEDULES: dict[str, Callable[..., float]] = {
    "constant": constant_after_warmup,
    "cosine": cosine_after_warmup,
}


# name -> torch.optim.AdamW's kernel flags, the same update computed three ways. auto: torch chooses —
# the per-parameter loop on CPU, foreach on CUDA (the kernel of every run before this setting). loop:
# one parameter at a time. foreach: multi-tensor ops, bit-identical to loop on CPU. fused: one kernel
# (HF Trainer's and TRL's default), rounded differently: ~1e-7 of the weights after 12 steps, enough to
# move a seed of the quickstart, which is why it is not the default.
ADAMW_IMPLS: dict[str, dict[str, bool]] = {
    "auto": {},
    "loop": {"foreach": False, "fused": False},
    "foreach": {"foreach": True, "fused": False},
    "fused": {"foreach": False, "fused": True},
}


def build_optimizer(
    params: Iterable[torch.nn.Parameter],
    *,
    lr: float,
    weight_decay: float = 0.01,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    adamw_impl: str = "auto",
) -> torch.optim.AdamW:
    """AdamW over the trainable parameters (those with requires_grad), computed by the kernel
    ADAMW_IMPLS[adamw_impl]."""
    if adamw_impl not in ADAMW_IMPLS:
        raise ValueError(f"unknown AdamW implementation {adamw_impl!r}; valid: {sorted(ADAMW_IMPLS)}")
    trainable = [p for p in params if p.requires_grad]
    if not trainable:
        raise ValueError("the model has no trainable parameters")
    return torch.optim.AdamW(
        trainable, lr=lr, weight_decay=weight_decay, betas=betas, eps=eps, **ADAMW_IMPLS[adamw_impl]
    )


def build_lr_schedule(
    optimizer: torch.optim.Optimizer,
    *,
    schedule: str = "constant",
    warmup_steps: int = 0,
    total_steps: int = 1,
    min_lr_ratio: float = 0.0,
) -> LambdaLR:
    """A LambdaLR whose multiplier follows LR_SCHEDULES[schedule]."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"unknown lr schedule {schedule!r}; valid: {sorted(LR_SCHEDULES)}")
    if warmup_steps < 0 or total_steps < 1:
        raise ValueError(f"need warmup_steps >= 0 and total_steps >= 1, got {warmup_steps}, {total_steps}")
    fn = LR_SCHEDULES[schedule]

    def multiplier(step: int) -> float:
        return fn(step, warmup_steps=warmup_steps, total_steps=total_steps, min_lr_ratio=min_lr_ratio)

    return LambdaLR(optimizer, multiplier)
