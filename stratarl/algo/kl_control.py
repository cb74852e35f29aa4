"""Layer 6, RL math: the KL penalty folded into the rewards, and the controllers that set its weight β.

r_t = s_t − β·kl_t on response tokens (Ziegler et al. 2019, arXiv:1909.08593). The trainer calls
`apply_kl_penalty` with the controller's current β, then `controller.update(current_kl, N)`.
Controllers are checkpointed through `state_dict()` / `load_state_dict()`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from stratarl.algo.kl import kl_penalty
from stratarl.algo.masked import masked_mean
from stratarl.algo.registry import look_up

# Ziegler et al. clip the proportional error to ±0.2 so β changes by at most 20%·n_steps/horizon.
ADAPTIVE_ERROR_CLIP = 0.2


class FixedKLController:
    """β stays `kl_coef`; `update` does nothing."""

    def __init__(self, kl_coef: float = 0.001):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: a fixed coefficient ignores the observed KL."""

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Proportional controller of β toward a target KL (Ziegler et al. 2019, arXiv:1909.08593):

    e = clip(KL / target − 1, −0.2, 0.2),    β ← β·(1 + e·n_steps / horizon).
    """

    def __init__(self, init_kl_coef: float = 0.001, target_kl: float = 0.1, horizon: int = 10000):
        if horizon <= 0:
            raise ValueError(f"horizon must be > 0 for the adaptive KL controller, got {horizon}")
        if target_kl <= 0:
            raise ValueError(f"target_kl must be > 0 for the adaptive KL controller, got {target_kl}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        error = float(np.clip(current_kl / self.target - 1.0, -ADAPTIVE_ERROR_CLIP, ADAPTIVE_ERROR_CLIP))
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])
        self.target = float(state["target"])
        self.horizon = state["horizon"]


KLController = FixedKLController | AdaptiveKLController

KL_CONTROLLERS: dict[str, type[FixedKLController] | type[AdaptiveKLController]] = {
    "fixed": FixedKLController,
    "adaptive": AdaptiveKLController,
}


def make_kl_controller(
    kind: str = "fixed", *, kl_coef: float = 0.001, target_kl: float = 0.1, horizon: int = 10000
) -> KLController:
    """A controller from verl's `algorithm.kl_ctrl` fields (type, kl_coef, target_kl, horizon)."""
    if kind == "fixed":
        return FixedKLController(kl_coef=kl_coef)
    if kind == "adaptive":
        return AdaptiveKLController(init_kl_coef=kl_coef, target_kl=target_kl, horizon=horizon)
    return look_up(KL_CONTROLLERS, kind, "KL controller")


def apply_kl_penalty(
    token_level_scores: Tensor,  # [N, T] s_t, the reward on the last action token
    old_log_prob: Tensor,  # [N, T]
    ref_log_prob: Tensor,  # [N, T]
    response_mask: Tensor,  # [N, T]
    beta: float,
    kind: str = "kl",
) -> tuple[Tensor, dict[str, float]]:
    """r_t = s_t − β·kl_t·m_t with kl_t = kl_penalty(old_log_prob, ref_log_prob, kind).

    Returns the [N, T] token_level_rewards and the metrics verl logs as `actor/reward_kl_penalty`
    (current_kl: the batch mean of per-sequence masked means of kl) and `actor/reward_kl_penalty_coeff`
    (the β used here), without the `actor/` prefix, which the trainer adds. Feed
    `metrics["reward_kl_penalty"]` and N to the controller's `update`, as verl does.
    """
    named = (("old_log_prob", old_log_prob), ("ref_log_prob", ref_log_prob), ("response_mask", response_mask))
    for name, tensor in named:
        if tensor.shape != token_level_scores.shape:
            raise ValueError(
                f"{name} {tuple(tensor.shape)} must match "
                f"token_level_scores {tuple(token_level_scores.shape)}"
            )
    kl = kl_penalty(old_log_prob, ref_log_prob, kind)  # [N, T]
    # where() rather than verl's product, so NaN/inf log-probs on padding cannot leak into rewards.
    kl = torch.where(response_mask.bool(), kl, torch.zeros((), dtype=kl.dtype, device=kl.device))
    token_level_rewards = token_level_scores - beta * kl
    per_sequence_kl = masked_mean(kl, response_mask, dim=-1)  # [N]
    current_kl = per_sequence_kl.mean().item() if per_sequence_kl.numel() else 0.0
    metrics = {"reward_kl_penalty": current_kl, "reward_kl_penalty_coeff": float(beta)}
    return token_level_rewards, metrics
