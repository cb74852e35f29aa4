"""RL math, composed: the distillation term of the actor's objective (`distillation.*`).

    L = L_task + c · L_distill       (use_task_rewards)
    L = L_distill                    (otherwise: the task's policy loss, entropy and KL terms drop)

L_distill is `algo.distillation.distillation_loss` of the configured per-token loss: between the
student's log π_θ and the teacher's `teacher_log_prob` on the tokens the student sampled, or
(forward_kl_topk) between log π_θ at the teacher's top-k ids — scored by the update's own forward,
`ResponseScores.top_k_log_probs` — and the teacher's `teacher_top_k_log_probs` there.
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
from stratarl.algo.distillation.top_k import top_k_diagnostics
from stratarl.transport.data_proto import DataProto

TOP_K_IDS = "teacher_top_k_ids"


@dataclass(frozen=True)
class DistillationTerm:
    loss_mode: str = "k3"
    use_policy_gradient: bool = False
    use_task_rewards: bool = True
    distillation_loss_coef: float = 1.0
    loss_max_clamp: float | None = None
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    log_prob_min_clamp: float | None = None  # forward_kl_topk: clamp of both log-probs from below
    top_k: int = 32  # forward_kl_topk: the teacher's tokens per position (its batch columns' K)

    @property
    def uses_top_k(self) -> bool:
        return get_distillation_loss(self.loss_mode).uses_top_k

    @property
    def reads(self) -> tuple[str, ...]:
        """The teacher's batch columns the term reads."""
        if self.uses_top_k:
            return ("teacher_log_prob", TOP_K_IDS, "teacher_top_k_log_probs")
        return ("teacher_log_prob",)

    @property
    def scores_at_ids(self) -> str | None:
        """The column of ids the update's forward must also score log π_θ at (the teacher's top-k)."""
        return TOP_K_IDS if self.uses_top_k else None

    def per_token_loss(self, micro: DataProto, scores) -> Tensor:  # [m, T] ℓ_t
        """ℓ_t of the configured loss: on the sampled token (log π_θ vs teacher_log_prob), or on the
        teacher's top-k ids (log π_θ at them, from this forward, vs teacher_top_k_log_probs)."""
        loss = get_distillation_loss(self.loss_mode)
        if not loss.uses_top_k:
            return loss.fn(log_prob=scores.log_prob, teacher_log_prob=micro["teacher_log_prob"])
        return loss.fn(
            student_top_k_log_probs=scores.top_k_log_probs,
            teacher_top_k_log_probs=micro["teacher_top_k_log_probs"],
            log_prob_min_clamp=self.log_prob_min_clamp,
        )

    def row_statistics(self, micro: DataProto, scores) -> dict[str, Tensor]:
        """What the trace shows of the term, per row of this micro-batch's update forward:
        `distillation_loss` [m, T] (ℓ_t, 0 outside the mask, before any clamp) and
        `distillation_loss_mean` [m] (its mean over the action tokens; NaN without any)."""
        with torch.no_grad():
            return distillation_loss_per_row(self.per_token_loss(micro, scores), micro["response_mask"])

    def combine(
        self,
        task_loss: Tensor,
        micro: DataProto,
        *,
        scores,  # the update forward's ResponseScores: log_prob [m, T] (+ top_k_log_probs [m, T, k])
        old_log_prob: Tensor,  # [m, T]
        loss_agg_mode: str,
        normalizers: dict,
        share: float,  # this micro-batch's share of the mini-batch's tokens (× dp_size)
    ) -> tuple[Tensor, dict[str, float]]:
        """(the actor's micro-batch loss with the distillation term, its metrics). `distillation/loss`
        is this micro-batch's part of the mini-batch's L_distill (the engine sums micro-batches)."""
        mask = micro["response_mask"]
        per_token = self.per_token_loss(micro, scores)  # [m, T]
        weights = micro["rollout_is_weights"] if "rollout_is_weights" in micro.columns else None
        distill, metrics = distillation_loss(
            per_token,
            response_mask=mask,
            log_prob=scores.log_prob,
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
        if self.uses_top_k:
            out |= {name: value * share for name, value in self._top_k_metrics(micro, scores).items()}
        return loss, out

    def _top_k_metrics(self, micro: DataProto, scores) -> dict[str, float]:
        """Means over this micro-batch's action tokens of the top-k diagnostics (verl's names):
        the student's and the teacher's mass on the teacher's ids, the share of the two top-k sets
        that overlap, and the mean token advantage on the shared ids (over positions sharing any)."""
        mask = micro["response_mask"].bool()
        with torch.no_grad():
            d = top_k_diagnostics(
                student_top_k_log_probs=scores.top_k_log_probs.detach(),
                teacher_top_k_log_probs=micro["teacher_top_k_log_probs"],
                teacher_top_k_ids=micro[TOP_K_IDS],
                student_top_k_ids=scores.top_k_ids,
                log_prob_min_clamp=self.log_prob_min_clamp,
            )
        if not mask.any():
            return {}
        k = micro[TOP_K_IDS].shape[-1]
        shared = mask & (d.overlap_count > 0)
        advantage = d.overlap_token_advantage[shared].mean().item() if shared.any() else 0.0
        return {
            "distillation/student_mass": d.student_mass[mask].mean().item(),
            "distillation/teacher_mass": d.teacher_mass[mask].mean().item(),
            "distillation/overlap_ratio": d.overlap_count[mask].float().mean().item() / k,
            "distillation/overlap_token_advantage": advantage,
        }
