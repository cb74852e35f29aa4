"""Layer 6, RL math: SAPO, a smooth sigmoid gate on the token ratio in place of PPO's hard clip
(verl's `sapo`). Soft Adaptive Policy Optimization: Gao et al., arXiv:2511.20347.
"""

from __future__ import annotations

import torch
from torch import Tensor

from stratarl.algo.policy_loss.inputs import (
    check_loss_inputs,
    clamped_log_ratio,
    ppo_kl,
    weight_by_rollout_is,
    zero_metric,
)
from stratarl.algo.policy_loss.output import PolicyLossOutput


def sapo_gate(ratio: Tensor, tau: Tensor) -> Tensor:
    """f(r) = σ(τ·(r − 1))·4/τ. f(1) = 2/τ and f'(1) = 1, like the plain ratio at r = 1; the gate
    then flattens smoothly instead of stopping at a clip bound, and a larger τ flattens sooner."""
    return torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)


def sapo_loss(
    *,
    log_prob: Tensor,  # [N, T]
    old_log_prob: Tensor,  # [N, T]
    advantages: Tensor,  # [N, T]
    response_mask: Tensor,  # [N, T] used only by the metrics
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    rollout_is_weights: Tensor | None = None,  # [N, T]
) -> PolicyLossOutput:
    """ℓ_it = −f(r_it; τ_it)·A_it·w_it, r = exp(clamp(log π − log π_old, ±20)),
    τ_it = tau_pos where A_it > 0, else tau_neg (tau_neg > tau_pos damps negative updates sooner).

    verl aggregates SAPO with seq-mean-token-mean whatever `loss_agg_mode` says; the registry entry
    declares that. Metrics: ppo_kl; pg_clipfrac and pg_clipfrac_lower are 0 (nothing is clipped).
    """
    check_loss_inputs(log_prob, old_log_prob, advantages, response_mask, rollout_is_weights)
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    tau_pos_t = torch.as_tensor(tau_pos, dtype=advantages.dtype, device=advantages.device)
    tau_neg_t = torch.as_tensor(tau_neg, dtype=advantages.dtype, device=advantages.device)
    tau = torch.where(advantages > 0, tau_pos_t, tau_neg_t)
    per_token = -sapo_gate(ratio, tau) * advantages
    metrics = {
        "pg_clipfrac": zero_metric(log_prob),
        "ppo_kl": ppo_kl(log_ratio, response_mask),
        "pg_clipfrac_lower": zero_metric(log_prob),
    }
    return PolicyLossOutput(weight_by_rollout_is(per_token, rollout_is_weights), metrics)
