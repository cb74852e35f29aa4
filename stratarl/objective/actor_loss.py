"""RL math, composed: the actor's objective, composed from `algo/` for the engine.

    L = agg(ℓ_pg) − c_H · agg(H) + c_KL · agg(KL(π ‖ π_ref))   (+ the distillation term)

where ℓ_pg is the per-token policy loss named in config, agg the configured aggregation with the
mini-batch totals as global normalisers (so the engine's micro-batch losses add up to the
mini-batch loss), H the token entropy and KL a per-token estimator (`use_kl_loss`); with
distillation, `DistillationTerm` adds (or alone makes) the teacher's term. The engine only
sees a callable; it never learns which algorithm it trains.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from stratarl.algo.aggregation import aggregate_loss
from stratarl.algo.kl import kl_penalty
from stratarl.algo.policy_loss import compute_policy_loss, get_policy_loss
from stratarl.algo.rollout_correction import rollout_correction
from stratarl.algo.row_statistics import ratio_statistics_per_row
from stratarl.objective.distillation_term import DistillationTerm
from stratarl.transport.data_proto import DataProto
from stratarl.transport.fields import ROW_ID


@dataclass(frozen=True)
class ActorLoss:
    """A LossFn (see `stratarl.engine.actor.LossFn`) for one policy-loss configuration."""

    policy_loss: str = "vanilla"
    hyperparameters: dict[str, Any] = field(default_factory=dict)  # e.g. clip_ratio_low/high/c
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: float | None = None  # S of seq-mean-token-sum-norm; None: the padded width T
    entropy_coeff: float = 0.0
    kl_loss_coef: float = 0.0  # 0 = no KL term in the loss
    kl_loss_type: str = "low_var_kl"
    # Bypass mode (old_log_probs are the rollout's): the settings of `rollout_correction`, applied to
    # the *current* π_θ against π_rollout in every micro-batch; None outside bypass mode. The loss is
    # then `vanilla` (no IS weights: the ratio already is π_θ/π_rollout) or `reinforce` (−w·A·log π).
    bypass_correction: dict[str, Any] | None = None
    # (ε_low, ε_high) of the per-trajectory clipped share the trace reports (actor.policy_loss's
    # clip_ratio_low/high; the PPO clip indicator whichever loss is trained).
    clip_bounds: tuple[float, float] = (0.2, 0.2)
    # On-policy single pass (`trainer.pi_old.FromUpdate`): π_old is this forward's own π_θ, detached — the
    # separate old-log-prob forward would compute the same numbers with the same weights — and
    # `row_statistics` hands it back per row (`log_prob`, `entropy`: [m, T]) as the batch's
    # old_log_probs / entropys.
    old_log_prob_from_forward: bool = False
    distillation: DistillationTerm | None = None  # distillation.enabled: reads the teacher's columns

    @classmethod
    def from_settings(cls, policy_loss: str, settings: dict[str, Any], **kwargs: Any) -> ActorLoss:
        """Keep only the hyper-parameters the named loss accepts (the config holds all losses' knobs)."""
        accepted = get_policy_loss(policy_loss).hyperparameters
        chosen = {k: v for k, v in settings.items() if k in accepted and v is not None}
        return cls(policy_loss=policy_loss, hyperparameters=chosen, **kwargs)

    @property
    def needs_entropy(self) -> bool:
        return self.entropy_coeff != 0.0

    @property
    def needs_reference(self) -> bool:
        return self.kl_loss_coef != 0.0

    @property
    def reads(self) -> tuple[str, ...]:
        """The batch columns `__call__` reads (besides the model's inputs); `rollout_is_weights` is
        read when the batch has it, and so is `row_id` (`row_statistics`, while tracing). A worker
        group sends a rank these and nothing else."""
        old = () if self.old_log_prob_from_forward else ("old_log_probs",)
        columns = ("response_mask", *old, "advantages", "rollout_is_weights", ROW_ID)
        columns += self.distillation.reads if self.distillation is not None else ()
        return columns + (("ref_log_prob",) if self.needs_reference else ())

    @property
    def scores_at_ids(self) -> str | None:
        """The batch column of token ids the update's forward also scores log π_θ at (the
        teacher's top-k of forward_kl_topk; `UpdateRequest.score_at_ids`), or None."""
        return None if self.distillation is None else self.distillation.scores_at_ids

    def old_log_prob(self, micro: DataProto, scores) -> Tensor:
        """[m, T] log π_old: the batch's, or (old_log_prob_from_forward) this forward's detached,
        0 outside response_mask as the separate forward writes it."""
        if not self.old_log_prob_from_forward:
            return micro["old_log_probs"]
        return scores.log_prob.detach() * micro["response_mask"].to(scores.log_prob.dtype)

    def row_statistics(self, micro: DataProto, scores) -> dict[str, Tensor]:
        """[m] per-trajectory statistics of this micro-batch's update forward (`ratio_statistics_per_row`):
        the engine collects them under the micro-batch's `row_id` when the batch carries one."""
        low, high = self.clip_bounds
        old_log_prob = self.old_log_prob(micro, scores)
        statistics = ratio_statistics_per_row(
            log_prob=scores.log_prob.detach(),
            old_log_prob=old_log_prob,
            advantages=micro["advantages"],
            response_mask=micro["response_mask"],
            clip_ratio_low=low,
            clip_ratio_high=high,
        )
        if self.distillation is not None:
            statistics |= self.distillation.row_statistics(micro, scores)
        if self.old_log_prob_from_forward:
            statistics["log_prob"] = old_log_prob
            if scores.entropy is not None:
                mask = micro["response_mask"].to(scores.entropy.dtype)
                statistics["entropy"] = scores.entropy.detach() * mask
        return statistics

    def __call__(self, micro: DataProto, scores, totals) -> tuple[Tensor, dict[str, float]]:
        mask = micro["response_mask"]  # [m, T]
        # This micro-batch's share of the mini-batch's tokens; × dp_size because the engine averages
        # metrics over data-parallel ranks (the shares of one rank add up to 1/D of the total).
        share = float(mask.sum()) * totals.dp_size / max(totals.num_tokens, 1)
        normalizers = {
            "dp_size": totals.dp_size,
            "global_num_tokens": totals.num_tokens,
            "global_batch_size": totals.num_sequences,
            "loss_scale_factor": self.loss_scale_factor,
        }
        weights = micro["rollout_is_weights"] if "rollout_is_weights" in micro.columns else None
        old_log_prob = self.old_log_prob(micro, scores)
        loss_mask, corr_metrics = mask, {}
        if self.bypass_correction is not None:
            # verl's bypass_mode loss: correction of π_θ (no grad) vs π_rollout, then a plain loss.
            weights, loss_mask, corr_metrics = rollout_correction(
                scores.log_prob.detach(), old_log_prob, mask, **self.bypass_correction
            )
            weights = weights if self.policy_loss == "reinforce" else None
        pg_loss, pg_metrics = compute_policy_loss(
            self.policy_loss,
            log_prob=scores.log_prob,
            old_log_prob=old_log_prob,
            advantages=micro["advantages"],
            response_mask=loss_mask,
            loss_agg_mode=self.loss_agg_mode,
            rollout_is_weights=weights,
            **normalizers,
            **self.hyperparameters,
        )

        def agg(per_token: Tensor) -> Tensor:
            return aggregate_loss(per_token, mask, self.loss_agg_mode, **normalizers)

        loss = pg_loss
        metrics = {"actor/pg_loss": pg_loss.item()}
        metrics |= {f"actor/{key}": float(value) * share for key, value in pg_metrics.items()}
        metrics |= {key: float(value) * share for key, value in corr_metrics.items()}
        if scores.entropy is not None:
            entropy = agg(scores.entropy)
            metrics["actor/entropy"] = entropy.item()
            if self.entropy_coeff:
                loss = loss - self.entropy_coeff * entropy
        if self.kl_loss_coef:
            kl = agg(kl_penalty(scores.log_prob, micro["ref_log_prob"], self.kl_loss_type))
            loss = loss + self.kl_loss_coef * kl
            metrics |= {"actor/kl_loss": kl.item(), "actor/kl_coef": self.kl_loss_coef * share}
        if self.distillation is not None:
            loss, distilled = self.distillation.combine(
                loss,
                micro,
                scores=scores,
                old_log_prob=old_log_prob,
                loss_agg_mode=self.loss_agg_mode,
                normalizers=normalizers,
                share=share,
            )
            metrics |= distilled
        return loss, metrics
