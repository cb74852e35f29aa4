"""Layer 6, RL math: the clipped PPO surrogate with asymmetric clip and dual clip (verl's `vanilla`).

PPO: Schulman et al., arXiv:1707.06347. Asymmetric ("clip-higher") bounds: DAPO, arXiv:2503.14476.
Dual clip: Ye et al., arXiv:1912.09729.
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


def ppo_clip_loss(
    *,
    log_prob: Tensor,  # [N, T] log π_θ of the sampled tokens (carries the gradient)
    old_log_prob: Tensor,  # [N, T] log π_old, the policy that the ratio is taken against
    advantages: Tensor,  # [N, T]
    response_mask: Tensor,  # [N, T] used only by the metrics
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    rollout_is_weights: Tensor | None = None,  # [N, T]
) -> PolicyLossOutput:
    """Per-token clipped surrogate, with dual clip for negative advantages.

        r = exp(clamp(log π − log π_old, ±20))
        ℓ¹ = −A·r,  ℓ² = −A·clip(r, 1 − ε_low, 1 + ε_high),  ℓᶜ = max(ℓ¹, ℓ²)
        ℓ = min(ℓᶜ, −A·c) where A < 0, else ℓᶜ;  then ℓ·w with rollout IS weights w.

    The dual clip bounds the loss of a negative-advantage token whose ratio ran far above 1
    (c = clip_ratio_c > 1). Metrics (masked means over the response mask):
    pg_clipfrac = share with ℓ² > ℓ¹ (the clip bound), pg_clipfrac_lower = share with A < 0 and
    ℓᶜ > −A·c (the dual clip bound), ppo_kl = mean of log π_old − log π.

    Tensor arguments are keyword-only: swapping log_prob and old_log_prob would silently invert r.
    """
    check_loss_inputs(log_prob, old_log_prob, advantages, response_mask, rollout_is_weights)
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c (dual-clip bound) must be > 1.0, got {clip_ratio_c}")
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)

    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    clip_loss = torch.maximum(unclipped, clipped)
    dual_bound = -advantages * clip_ratio_c
    dual_clip_loss = torch.minimum(dual_bound, clip_loss)
    per_token = torch.where(advantages < 0, dual_clip_loss, clip_loss)

    is_negative = (advantages < 0).float()
    metrics = {
        "pg_clipfrac": masked_mean((clipped > unclipped).float(), response_mask).detach(),
        "ppo_kl": ppo_kl(log_ratio, response_mask),
        "pg_clipfrac_lower": masked_mean(
            (clip_loss > dual_bound).float() * is_negative, response_mask
        ).detach(),
    }
    return PolicyLossOutput(weight_by_rollout_is(per_token, rollout_is_weights), metrics)
