"""RL math, composed: the distillation term of the actor's objective (`distillation.*`).

    L = L_task + c · L_distill       (use_task_rewards)
    L = L_distill                    (otherwise: the task's policy loss, entropy and KL terms drop)

L_distill is `algo.distillation.distillation_loss` of the configured per-token loss between the
student's log π_θ and the teacher's `teacher_log_prob` on the tokens the student sampled.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from stratarl.algo.distillation import (
    distillation_loss,
    distillation_loss_per_row,
    get_distillation_loss,
    sampled_token_abs_mean,
    with_task_loss,
)
from stratarl.transport.data_proto import DataProto


@dataclass(frozen=True)
class DistillationTerm:
    loss_mode: str = "k3"
    use_policy_gradient: bool = False
    use_task_rewards: bool = True
    distillation_loss_coef: float = 1.0
    loss_max_clamp: float | None = None
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2

    def __post_init__(self) -> None:
        if get_distillation_loss(self.loss_mode).uses_top_k:
            raise ValueError(
                f"distillation loss {self.loss_mode!r} needs the teacher's top-k, not built here"
            )

    def row_statistics(self, micro: DataProto, *, log_prob: Tensor) -> dict[str, Tensor]:
        """What the trace shows of the term, per row of this micro-batch's update forward:
        `distillation_loss` [m, T] (ℓ_t, 0 outside the mask, before any clamp) and
        `distillation_loss_mean` [m] (its mean over the action tokens; NaN without any)."""
        with torch.no_grad():
            per_token = get_distillation_loss(self.loss_mode).fn(
                log_prob=log_prob.detach(), teacher_log_prob=micro["teacher_log_prob"]
            )  # [m, T]
            return distillation_loss_per_row(per_token, micro["response_mask"])

    def combine(
        self,
        task_loss: Tensor,
        micro: DataProto,
        *,
        log_prob: Tensor,  # [m, T] log π_θ (carries the gradient)
        old_log_prob: Tensor,  # [m, T]
        loss_agg_mode: str,
        normalizers: dict,
        share: float,  # this micro-batch's share of the mini-batch's tokens (× dp_size)
    ) -> tuple[Tensor, dict[str, float]]:
        """(the actor's micro-batch loss with the distillation term, its metrics). `distillation/loss`
        is this micro-batch's part of the mini-batch's L_distill (the engine sums micro-batches)."""
        mask = micro["response_mask"]
        per_token = get_distillation_loss(self.loss_mode).fn(
            log_prob=log_prob, teacher_log_prob=micro["teacher_log_prob"]
        )  # [m, T]
        weights = micro["rollout_is_weights"] if "rollout_is_weights" in micro.columns else None
        distill, metrics = distillation_loss(
            per_token,
            response_mask=mask,
            log_prob=log_prob,
            old_log_prob=old_log_prob,
            use_policy_gradient=self.use_policy_gradient,
            loss_agg_mode=loss_agg_mode,
            loss_max_clamp=self.loss_max_clamp,
            clip_ratio_low=self.clip_ratio_low,
            clip_ratio_high=self.clip_ratio_high,
            rollout_is_weights=weights,
            **normalizers,
        )
        loss = with_task_loss(
            task_loss,
            distill,
            use_task_rewards=self.use_task_rewards,
            distillation_loss_coef=self.distillation_loss_coef,
        )
        out = {"distillation/loss": distill.item()}
        out["distillation/abs_loss"] = sampled_token_abs_mean(per_token.detach(), mask).item() * share
        if self.use_policy_gradient:
            out |= {f"distillation/{k}": float(metrics[k]) * share for k in ("pg_clipfrac", "ppo_kl")}
        return loss, out
