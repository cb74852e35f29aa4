"""Layer 2, control flow: where a step's π_old comes from — a separate forward, the rollout's own
log-probs, or the update's own forward — as three sources the step is given.

    SeparateForward   old log-prob phase before the update (the general case)
    RolloutLogProbs   algorithm.rollout_correction.bypass_mode: π_old := π_rollout, no forward
    FromUpdate        one on-policy optimizer step a batch: the update's forward is π_old

FromUpdate: with one optimizer step per batch (one mini-batch, one epoch) the update's forward runs
with the weights that generated nothing since the last sync — the very weights the old-log-prob
phase would score with — on the same inputs, in the same micro-batches. So its detached log-probs
*are* π_old: the loss takes them from its own forward (`ActorLoss.old_log_prob_from_forward`) and
hands them back per row, and the batch gets `old_log_probs` / `entropys` after the update, as the
separate forward would have written them. The ratio π_θ/π_old is then exactly 1 in value and its
gradient is ∇log π_θ, as in the recompute path (TRL skips the recompute in this case too).

`reuse_blockers` lists what makes that unsound for a config: something reads π_old before the
update (KL in the reward, decoupled rollout correction, an estimator's input), more than one
optimizer step per batch, a critic warm-up (steps without an actor update), or dropout (the update's
forward runs in train mode, the old-log-prob forward in eval mode).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch

from stratarl.cluster.handles import PolicyHandle
from stratarl.config import RunConfig
from stratarl.trainer import phases
from stratarl.transport.data_proto import DataProto
from stratarl.transport.field_checks import validate
from stratarl.transport.fields import ROW_ID

PI_OLD_INPUTS = frozenset({"old_log_prob", "sum_pi_squared"})  # estimator inputs of the old forward

Timed = Callable[[str, DataProto], AbstractContextManager[None]]  # (phase name, batch) -> its timer


class OldLogProbs(Protocol):
    """Where π_old (`old_log_probs`, and `entropys`) comes from."""

    from_update: bool  # the update's own forward writes them: its loss reads no old_log_probs
    line: str  # where π_old comes from and why, printed at the start of a run

    def before_update(self, worker: PolicyHandle, batch: DataProto, timed: Timed) -> DataProto:
        """The batch with π_old where it is known before the update (else unchanged)."""
        ...

    def after_update(self, batch: DataProto, row_stats: dict[str, torch.Tensor]) -> DataProto:
        """The batch with π_old where the update's forward computed it (else unchanged)."""
        ...


class SeparateForward:
    """The old-log-prob phase: one forward of the weights about to be updated (+ Σ_v π² for the
    optimal-token-baseline estimators, from the same forward)."""

    from_update = False

    def __init__(self, *, with_sum_pi_squared: bool, line: str):
        self.with_sum_pi_squared, self.line = with_sum_pi_squared, line

    def before_update(self, worker: PolicyHandle, batch: DataProto, timed: Timed) -> DataProto:
        with timed("old_log_prob", batch):
            return phases.old_log_prob(worker, batch, with_sum_pi_squared=self.with_sum_pi_squared)

    def after_update(self, batch: DataProto, row_stats: dict[str, torch.Tensor]) -> DataProto:
        return batch


class RolloutLogProbs:
    """Bypass mode (two policies): π_old := π_rollout, no recompute forward."""

    from_update = False
    line = (
        "old log-probs: the rollout's own, no old-log-prob forward "
        "(algorithm.rollout_correction.bypass_mode: π_old is π_rollout)"
    )

    def before_update(self, worker: PolicyHandle, batch: DataProto, timed: Timed) -> DataProto:
        validate(batch, reads=["rollout_log_probs"], phase="actor.log_prob")
        return batch.union(DataProto.from_dict({"old_log_probs": batch["rollout_log_probs"].clone()}))

    def after_update(self, batch: DataProto, row_stats: dict[str, torch.Tensor]) -> DataProto:
        return batch


class FromUpdate:
    """One on-policy optimizer step a batch: the update's forward writes `old_log_probs` and
    `entropys` ([N, T]) from its per-row statistics (rows with no action token, which the engines
    drop, stay 0 as the separate forward leaves them)."""

    from_update = True
    line = "old log-probs: from the update's own forward (one on-policy optimizer step a batch)"

    def before_update(self, worker: PolicyHandle, batch: DataProto, timed: Timed) -> DataProto:
        return batch

    def after_update(self, batch: DataProto, row_stats: dict[str, torch.Tensor]) -> DataProto:
        shape = batch["response_mask"].shape
        columns = {}
        for stat, name in (("log_prob", "old_log_probs"), ("entropy", "entropys")):
            column = torch.zeros(shape, dtype=torch.float32)
            if row_stats:
                column[row_stats[ROW_ID].long()] = row_stats[stat].to(torch.float32)
            columns[name] = column
        return batch.union(DataProto.from_dict(columns))


def choose_old_log_probs(
    cfg: RunConfig, *, model_has_dropout: bool, estimator_inputs: frozenset[str]
) -> OldLogProbs:
    """The source `cfg` allows: the rollout's (bypass mode), the update's (no blocker), or a forward."""
    if cfg.algorithm.rollout_correction.bypass_mode:
        return RolloutLogProbs()
    blockers = reuse_blockers(cfg, model_has_dropout=model_has_dropout, estimator_inputs=estimator_inputs)
    if not blockers:
        return FromUpdate()
    line = f"old log-probs: a separate forward ({'; '.join(blockers)})"
    return SeparateForward(with_sum_pi_squared="sum_pi_squared" in estimator_inputs, line=line)


def reuse_blockers(cfg: RunConfig, *, model_has_dropout: bool, estimator_inputs: frozenset[str]) -> list[str]:
    """Why π_old cannot come from the update's forward under `cfg` (empty: it can)."""
    a, rc = cfg.algorithm, cfg.algorithm.rollout_correction
    found = {
        "actor.old_log_prob_from_update=false": not cfg.actor.old_log_prob_from_update,
        "algorithm.rollout_correction.bypass_mode (π_old is π_rollout)": rc.bypass_mode,
        "actor.ppo_epochs > 1": cfg.actor.ppo_epochs > 1,
        "actor.prompts_per_mini_batch < data.prompts_per_step": cfg.actor.prompts_per_mini_batch
        < cfg.data.prompts_per_step,
        "algorithm.use_kl_in_reward (reads π_old)": a.use_kl_in_reward,
        "algorithm.rollout_correction.rollout_is/rs (read π_old)": bool(rc.rollout_is or rc.rollout_rs),
        f"trainer.mode={cfg.trainer.mode} with async_training.correction=decoupled (its IS weights "
        "read π_old before the update)": cfg.trainer.mode != "sync"
        and cfg.async_training.correction == "decoupled",
        f"algorithm.adv_estimator={a.adv_estimator} (reads π_old)": bool(estimator_inputs & PI_OLD_INPUTS),
        "critic.warmup_training_steps > 0 (steps without an actor update)": cfg.uses_critic
        and cfg.critic.warmup_training_steps > 0,
        "the model has dropout": model_has_dropout,
    }
    return [reason for reason, blocks in found.items() if blocks]


def has_dropout(model_config: Any) -> bool:
    """Any non-zero `*dropout*` / `*pdrop*` probability in an HF model config."""
    for name, value in vars(model_config).items():
        is_probability = isinstance(value, float) and not isinstance(value, bool)
        if ("dropout" in name or "pdrop" in name) and is_probability and value > 0.0:
            return True
    return False


def with_row_ids(batch: DataProto) -> DataProto:
    """`row_id` = row index: the engines report the update's per-row statistics under it."""
    if ROW_ID in batch.columns:
        return batch
    return batch.union(DataProto.from_dict({ROW_ID: torch.arange(len(batch), dtype=torch.int64)}))
