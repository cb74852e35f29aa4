"""Layer 6, RL math: losses of the form −c·A·log π, whose gradient is a weighted score function
rather than a clipped ratio: GPG (`gpg`), CISPO (`cispo`), DRO (`dro`) and REINFORCE with
rollout importance weights (`reinforce`, the loss of verl's bypass mode with loss_type=reinforce).
"""

from __future__ import annotations

import torch
from torch import Tensor

from stratarl.algo.masked import masked_mean
from stratarl.algo.policy_loss.inputs import (
    check_loss_inputs,
    clamped_log_ratio,
    ppo_kl,
    weight_by_rollout_is,
    zero_metric,
)
from stratarl.algo.policy_loss.output import PolicyLossOutput


def gpg_loss(
    *,
    log_prob: Tensor,  # [N, T]
    old_log_prob: Tensor,  # [N, T] unused; kept for the common signature
    advantages: Tensor,  # [N, T]
    response_mask: Tensor,  # [N, T] unused; kept for the common signature
    rollout_is_weights: Tensor | None = None,  # [N, T]
) -> PolicyLossOutput:
    """GPG (Chu et al., arXiv:2504.02546): ℓ = −A·log π·w, no ratio, no clip. No metrics, as in verl."""
    check_loss_inputs(log_prob, old_log_prob, advantages, response_mask, rollout_is_weights)
    return PolicyLossOutput(weight_by_rollout_is(-log_prob * advantages, rollout_is_weights), {})


def cispo_loss(
    *,
    log_prob: Tensor,  # [N, T]
    old_log_prob: Tensor,  # [N, T]
    advantages: Tensor,  # [N, T]
    response_mask: Tensor,  # [N, T] used only by the metrics
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    rollout_is_weights: Tensor | None = None,  # [N, T]
) -> PolicyLossOutput:
    """CISPO (MiniMax-M1, arXiv:2506.13585): clip the importance weight, not the update.

        r = exp(clamp(log π − log π_old, ±20)),  ℓ = −sg(clip(r, 1 − ε_low, 1 + ε_high))·A·log π·w

    Every token keeps a gradient −sg(clip(r))·A·∇log π, clipped or not (PPO would drop it).
    Metrics: pg_clipfrac = share of tokens with r outside the bounds, ppo_kl, pg_clipfrac_lower = 0.
    """
    check_loss_inputs(log_prob, old_log_prob, advantages, response_mask, rollout_is_weights)
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    clipped_ratio = torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    per_token = -clipped_ratio.detach() * advantages * log_prob
    metrics = {
        "pg_clipfrac": masked_mean((ratio != clipped_ratio).float(), response_mask).detach(),
        "ppo_kl": ppo_kl(log_ratio, response_mask),
        "pg_clipfrac_lower": zero_metric(log_prob),
    }
    return PolicyLossOutput(weight_by_rollout_is(per_token, rollout_is_weights), metrics)


def dro_loss(
    *,
    log_prob: Tensor,  # [N, T]
    old_log_prob: Tensor,  # [N, T]
    advantages: Tensor,  # [N, T]
    response_mask: Tensor,  # [N, T] used only by the metrics
    dro_beta: float | None = None,
    rollout_is_weights: Tensor | None = None,  # [N, T]
) -> PolicyLossOutput:
    """DRO, Direct Reward Optimization (Richemond et al., arXiv:2405.19107), per token:

        ℓ = −(A·log π − ½·β·(log π − log π_old)²)·w       (no ±20 clamp)

    The quadratic term is a proximal penalty in place of a clip. β = dro_beta must be > 0; verl's
    default is null and it raises, so do we. Metrics: ppo_kl.
    """
    check_loss_inputs(log_prob, old_log_prob, advantages, response_mask, rollout_is_weights)
    if dro_beta is None or dro_beta <= 0:
        raise ValueError(f"dro_beta must be a positive number for the dro loss, got {dro_beta}")
    log_ratio = log_prob - old_log_prob
    per_token = -(log_prob * advantages - 0.5 * dro_beta * log_ratio.square())
    metrics = {"ppo_kl": ppo_kl(log_ratio, response_mask)}
    return PolicyLossOutput(weight_by_rollout_is(per_token, rollout_is_weights), metrics)


def reinforce_loss(
    *,
    log_prob: Tensor,  # [N, T]
    old_log_prob: Tensor,  # [N, T] log π_rollout in bypass mode; enters only ppo_kl
    advantages: Tensor,  # [N, T]
    response_mask: Tensor,  # [N, T] used only by the metrics (already rejection-masked)
    rollout_is_weights: Tensor | None = None,  # [N, T] truncated π/π_rollout, detached
) -> PolicyLossOutput:
    """REINFORCE with optional importance weights: ℓ = −A·log π·w (w = 1 without weights).

    verl's `compute_policy_loss_reinforce`, which bypass mode (old_log_prob := rollout_log_prob,
    loss_type=reinforce) calls after computing w and the rejection mask from π vs π_rollout. The
    weights are computed by the rollout-correction step, not here. Metrics: ppo_kl (unclamped).
    """
    check_loss_inputs(log_prob, old_log_prob, advantages, response_mask, rollout_is_weights)
    per_token = weight_by_rollout_is(-advantages * log_prob, rollout_is_weights)
    return PolicyLossOutput(per_token, {"ppo_kl": ppo_kl(log_prob - old_log_prob, response_mask)})
