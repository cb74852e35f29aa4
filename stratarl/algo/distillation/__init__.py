"""Layer 6, RL math: on-policy distillation — the student samples, a frozen teacher scores each
sampled token, and the student learns from the teacher's per-token distribution on its own
trajectories (verl 0.9.1's `distillation.distillation_loss`).

Owns the registry `DISTILLATION_LOSSES` (verl's `loss_mode` names) and `distillation_loss`, which
turns a per-token loss [N, T] into the scalar the actor adds to its objective, either directly
(supervised, arXiv:2306.13649) or as a reward −ℓ_t in a PPO-clip loss (the policy-gradient form).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from stratarl.algo.aggregation import Count, aggregate_loss
from stratarl.algo.distillation.sampled_token import (
    reverse_kl_abs,
    reverse_kl_k1,
    reverse_kl_k2,
    reverse_kl_k3,
)
from stratarl.algo.distillation.top_k import forward_kl_top_k
from stratarl.algo.policy_loss.ppo_clip import ppo_clip_loss
from stratarl.algo.registry import look_up


@dataclass(frozen=True)
class DistillationLoss:
    """A registered distillation loss.

    fn: keyword-only -> per-token loss [N, T]. Sampled-token losses take (log_prob, teacher_log_prob);
    top-k losses take (student_top_k_log_probs, teacher_top_k_log_probs, log_prob_min_clamp).
    uses_top_k: the teacher must hand over its top-k ids and log-probs, not only the sampled token's.
    teaches_when_backpropagated: False where ∇ℓ does not depend on the teacher (k1), so the loss is
    only usable in the policy-gradient form.
    """

    fn: Callable[..., Tensor]
    uses_top_k: bool = False
    teaches_when_backpropagated: bool = True


DISTILLATION_LOSSES: dict[str, DistillationLoss] = {
    "k1": DistillationLoss(reverse_kl_k1, teaches_when_backpropagated=False),
    "kl": DistillationLoss(reverse_kl_k1, teaches_when_backpropagated=False),
    "abs": DistillationLoss(reverse_kl_abs),
    "k2": DistillationLoss(reverse_kl_k2),
    "mse": DistillationLoss(reverse_kl_k2),
    "k3": DistillationLoss(reverse_kl_k3),
    "low_var_kl": DistillationLoss(reverse_kl_k3),
    "forward_kl_topk": DistillationLoss(forward_kl_top_k, uses_top_k=True),
}


def get_distillation_loss(name: str) -> DistillationLoss:
    """The loss registered under `name`; ValueError naming the valid names otherwise."""
    return look_up(DISTILLATION_LOSSES, name, "distillation loss")


def distillation_loss(
    per_token_loss: Tensor,  # [N, T] ℓ_t of one registered loss
    *,
    response_mask: Tensor,  # [N, T]
    log_prob: Tensor,  # [N, T] log π_θ (policy-gradient form only)
    old_log_prob: Tensor,  # [N, T] log π_old (policy-gradient form only)
    use_policy_gradient: bool = False,
    loss_agg_mode: str = "token-mean",
    loss_max_clamp: float | None = None,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    rollout_is_weights: Tensor | None = None,  # [N, T]
    dp_size: int = 1,
    global_num_tokens: Count | None = None,
    global_batch_size: Count | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """(scalar L_distill, metrics without the `distillation/` prefix).

        ℓ'_t = clamp(ℓ_t, −c, c)                   (c = loss_max_clamp; None: ℓ'_t = ℓ_t)
        supervised:       L = agg(ℓ')
        policy gradient:  L = agg(ℓ_ppo-clip(r_t, Â_t = −sg(ℓ'_t)))   with r_t = π_θ / π_old

    The policy-gradient form treats the teacher's disagreement as a dense per-token reward, with its
    own clip ratios and verl's dual-clip bound c = 3 (Â ≤ 0 wherever ℓ' ≥ 0). `loss_min`/`loss_max`
    are over the masked tokens, before the clamp.
    """
    mask = response_mask.bool()
    valid = per_token_loss[mask]
    empty = valid.numel() == 0
    metrics = {
        "loss_min": valid.min().detach() if not empty else per_token_loss.new_zeros(()),
        "loss_max": valid.max().detach() if not empty else per_token_loss.new_zeros(()),
    }
    if loss_max_clamp is not None:
        per_token_loss = per_token_loss.clamp(min=-loss_max_clamp, max=loss_max_clamp)
    normalizers = {
        "dp_size": dp_size,
        "global_num_tokens": global_num_tokens,
        "global_batch_size": global_batch_size,
        "loss_scale_factor": loss_scale_factor,
    }
    if not use_policy_gradient:
        return aggregate_loss(per_token_loss, response_mask, loss_agg_mode, **normalizers), metrics
    output = ppo_clip_loss(
        log_prob=log_prob,
        old_log_prob=old_log_prob,
        advantages=-per_token_loss.detach(),
        response_mask=response_mask,
        clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high,
        rollout_is_weights=rollout_is_weights,
    )
    metrics |= output.metrics
    return aggregate_loss(output.per_token_loss, response_mask, loss_agg_mode, **normalizers), metrics


def with_task_loss(
    task_loss: Tensor, distill: Tensor, *, use_task_rewards: bool, distillation_loss_coef: float
) -> Tensor:
    """L = L_task + c · L_distill with task rewards; L = L_distill alone without (c unused)."""
    if not use_task_rewards:
        return distill
    return task_loss + distillation_loss_coef * distill


def sampled_token_abs_mean(per_token_loss: Tensor, response_mask: Tensor) -> Tensor:
    """mean |ℓ_t| over the masked tokens (verl's `distillation/abs_loss`: k1 may be negative)."""
    mask = response_mask.bool()
    return per_token_loss[mask].abs().mean() if mask.any() else torch.zeros(())


def distillation_loss_per_row(per_token_loss: Tensor, response_mask: Tensor) -> dict[str, Tensor]:
    """The trace's view of ℓ_t: `distillation_loss` [N, T] = m_t·ℓ_t and `distillation_loss_mean`
    [N] = Σ_t m_t·ℓ_t / Σ_t m_t (NaN for a row without action tokens)."""
    mask = response_mask.to(torch.float32)
    masked = torch.where(mask.bool(), per_token_loss.float(), 0.0)
    tokens = mask.sum(-1)  # [N]
    mean = masked.sum(-1) / tokens.clamp(min=1)
    nan = torch.full_like(mean, float("nan"))
    return {"distillation_loss": masked, "distillation_loss_mean": torch.where(tokens > 0, mean, nan)}


__all__ = [
    "DISTILLATION_LOSSES",
    "DistillationLoss",
    "distillation_loss",
    "distillation_loss_per_row",
    "get_distillation_loss",
    "sampled_token_abs_mean",
    "with_task_loss",
]
