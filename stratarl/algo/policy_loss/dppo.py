"""Layer 6, RL math: DPPO, a trust region on a divergence between π and π_old of the sampled token
instead of on the ratio (verl's `dppo_tv`, `dppo_kl`).

Qi et al., "Rethinking the Trust Region in LLM Reinforcement Learning", arXiv:2602.04879. Both
variants are the "Binary" approximations: the distribution is collapsed to (p, 1 − p), with p the
probability of the sampled token.
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
)
from stratarl.algo.policy_loss.output import PolicyLossOutput

# verl's guard inside the logs of the binary KL.
BINARY_KL_EPS = 1e-8


def _masked_policy_gradient(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    keep: Tensor,  # [N, T] bool: inside the trust region
    clip_ratio_c: float,
    rollout_is_weights: Tensor | None,
) -> PolicyLossOutput:
    """ℓ = −A·sg(min(r, c))·log π·keep·w, the shared tail of both DPPO variants.

    The ratio is a truncated importance weight (TIS, paper §5.4), not a clipped surrogate: its
    gradient is stopped, so ∇ℓ = −A·min(r, c)·∇log π on kept tokens and 0 elsewhere.
    """
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    truncated_ratio = torch.clamp(ratio, max=clip_ratio_c).detach()
    kept = keep.float()
    per_token = -advantages * truncated_ratio * log_prob * kept
    metrics = {
        "pg_clipfrac": masked_mean(1.0 - kept, response_mask).detach(),
        "ppo_kl": ppo_kl(log_ratio, response_mask),
        "pg_clipfrac_lower": masked_mean((ratio > clip_ratio_c).float() * kept, response_mask).detach(),
    }
    return PolicyLossOutput(weight_by_rollout_is(per_token, rollout_is_weights), metrics)


def dppo_tv_loss(
    *,
    log_prob: Tensor,  # [N, T]
    old_log_prob: Tensor,  # [N, T]
    advantages: Tensor,  # [N, T]
    response_mask: Tensor,  # [N, T] used only by the metrics
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    rollout_is_weights: Tensor | None = None,  # [N, T]
) -> PolicyLossOutput:
    """DPPO-Binary-TV: keep a token when p − p_old ≤ δ_high (A > 0) or p − p_old ≥ −δ_low (A ≤ 0).

    clip_ratio_low/high are reused as the bounds δ on the probability difference (the paper's
    recipe uses 0.15). clip_ratio_c truncates the IS ratio; its default 3.0 is what verl's actor
    config supplies (verl's code falls back to 20 only without the key; the recipe sets 1e4).
    Metrics: pg_clipfrac = share of tokens dropped by the trust region, pg_clipfrac_lower = share
    kept with r > c (truncated), ppo_kl.
    """
    check_loss_inputs(log_prob, old_log_prob, advantages, response_mask, rollout_is_weights)
    prob_change = torch.exp(log_prob) - torch.exp(old_log_prob)
    keep = torch.where(advantages > 0, prob_change <= clip_ratio_high, prob_change >= -clip_ratio_low)
    return _masked_policy_gradient(
        log_prob, old_log_prob, advantages, response_mask, keep, clip_ratio_c, rollout_is_weights
    )


def binary_kl(log_prob: Tensor, old_log_prob: Tensor) -> Tensor:
    """KL((p_old, 1 − p_old) ‖ (p, 1 − p)) per token, with verl's 1e-8 inside the second log."""
    prob, old_prob = torch.exp(log_prob), torch.exp(old_log_prob)
    return old_prob * (old_log_prob - log_prob) + (1 - old_prob) * torch.log(
        (1.0 - old_prob + BINARY_KL_EPS) / (1.0 - prob + BINARY_KL_EPS)
    )


def dppo_kl_loss(
    *,
    log_prob: Tensor,  # [N, T]
    old_log_prob: Tensor,  # [N, T]
    advantages: Tensor,  # [N, T]
    response_mask: Tensor,  # [N, T] used only by the metrics
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    rollout_is_weights: Tensor | None = None,  # [N, T]
) -> PolicyLossOutput:
    """DPPO-Binary-KL: keep a token when the binary KL is within δ_high (A > 0) or δ_low (A ≤ 0),
    or when p moved in the safe direction (p ≤ p_old for A > 0, p ≥ p_old for A ≤ 0).

    clip_ratio_low/high are reused as the KL bounds δ (the paper's recipe uses 0.05); clip_ratio_c
    as in `dppo_tv_loss`. Same metrics.
    """
    check_loss_inputs(log_prob, old_log_prob, advantages, response_mask, rollout_is_weights)
    divergence = binary_kl(log_prob, old_log_prob)
    prob, old_prob = torch.exp(log_prob), torch.exp(old_log_prob)
    keep_positive = (divergence <= clip_ratio_high) | (prob <= old_prob)
    keep_negative = (divergence <= clip_ratio_low) | (prob >= old_prob)
    keep = torch.where(advantages > 0, keep_positive, keep_negative)
    return _masked_policy_gradient(
        log_prob, old_log_prob, advantages, response_mask, keep, clip_ratio_c, rollout_is_weights
    )
