"""Layer 6, RL math: what the policy losses share about their inputs: shape checks, the clamped
log importance ratio, the `ppo_kl` metric and the rollout importance weights.
"""

from __future__ import annotations

import torch
from torch import Tensor

from stratarl.algo.masked import masked_mean

# verl clamps log(π/π_old) to ±20 before exp() in vanilla, sapo, cispo and dppo, so that a stale
# or broken log-prob cannot overflow the ratio. gspo, geo_mean, clip_cov, kl_cov and dro do not.
LOG_RATIO_BOUND = 20.0


def check_loss_inputs(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    rollout_is_weights: Tensor | None = None,
) -> None:
    """Every input of a policy loss is [N, T] with the same shape; ValueError naming the culprit."""
    if log_prob.dim() != 2:
        raise ValueError(f"log_prob must be [N, T], got shape {tuple(log_prob.shape)}")
    others = {
        "old_log_prob": old_log_prob,
        "advantages": advantages,
        "response_mask": response_mask,
        "rollout_is_weights": rollout_is_weights,
    }
    for name, tensor in others.items():
        if tensor is not None and tensor.shape != log_prob.shape:
            raise ValueError(f"{name} shape {tuple(tensor.shape)} != log_prob shape {tuple(log_prob.shape)}")


def clamped_log_ratio(log_prob: Tensor, old_log_prob: Tensor) -> Tensor:
    """log r = clamp(log π − log π_old, −20, 20) [N, T]. The clamp stops the gradient where it binds."""
    return torch.clamp(log_prob - old_log_prob, min=-LOG_RATIO_BOUND, max=LOG_RATIO_BOUND)


def ppo_kl(log_ratio: Tensor, response_mask: Tensor) -> Tensor:
    """verl's `ppo_kl` metric: masked mean of −log r = log π_old − log π (the k1 estimate of
    KL(π_old ‖ π) on the sampled tokens), detached."""
    return masked_mean(-log_ratio, response_mask).detach()


def weight_by_rollout_is(per_token_loss: Tensor, rollout_is_weights: Tensor | None) -> Tensor:
    """ℓ_it · w_it with the (already truncated, detached) rollout importance weights, if any."""
    return per_token_loss if rollout_is_weights is None else per_token_loss * rollout_is_weights


def zero_metric(reference: Tensor) -> Tensor:
    """A 0 metric on the device of `reference`, for verl's always-zero compatibility metrics."""
    return torch.zeros((), dtype=reference.dtype, device=reference.device)
