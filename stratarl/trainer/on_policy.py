"""Layer 2, control flow: when the separate old-log-prob forward can be skipped, and what replaces it.

With one optimizer step per batch (one mini-batch, one epoch) the update's forward runs with the
weights that generated nothing since the last sync — the very weights the old-log-prob phase would
score with — on the same inputs, in the same micro-batches. So its detached log-probs *are*
π_old: the loss takes them from its own forward (`ActorLoss.old_log_prob_from_forward`) and hands
them back per row, and the batch gets `old_log_probs` / `entropys` after the update, as the
separate forward would have written them. The ratio π_θ/π_old is then exactly 1 in value and its
gradient is ∇log π_θ, as in the recompute path (TRL skips the recompute in this case too).

`reuse_blockers` lists what makes the shortcut unsound for a config: something reads π_old before
the update (KL in the reward, decoupled rollout correction, an estimator's input), more than one
optimizer step per batch, a critic warm-up (steps without an actor update), or dropout (the update's
forward runs in train mode, the old-log-prob forward in eval mode).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoConfig

from stratarl.config import RunConfig
from stratarl.trainer.builders import estimator_inputs
from stratarl.transport.data_proto import DataProto
from stratarl.transport.fields import ROW_ID

PI_OLD_INPUTS = frozenset({"old_log_prob", "sum_pi_squared"})  # estimator inputs of the old forward


def old_log_prob_reuse(cfg: RunConfig) -> tuple[bool, str]:
    """(whether π_old comes from the update's forward, a line saying where it comes from and why)."""
    if cfg.algorithm.rollout_correction.bypass_mode:  # no forward at all: the rollout's log-probs
        return False, (
            "old log-probs: the rollout's own, no old-log-prob forward "
            "(algorithm.rollout_correction.bypass_mode: π_old is π_rollout)"
        )
    model_config = AutoConfig.from_pretrained(cfg.model.path, trust_remote_code=cfg.model.trust_remote_code)
    blockers = reuse_blockers(cfg, model_config)
    if not blockers:
        return True, "old log-probs: from the update's own forward (one on-policy optimizer step a batch)"
    return False, f"old log-probs: a separate forward ({'; '.join(blockers)})"


def reuse_blockers(cfg: RunConfig, model_config: Any) -> list[str]:
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
        f"algorithm.adv_estimator={a.adv_estimator} (reads π_old)": bool(
            estimator_inputs(cfg) & PI_OLD_INPUTS
        ),
        "critic.warmup_training_steps > 0 (steps without an actor update)": cfg.uses_critic
        and cfg.critic.warmup_training_steps > 0,
        "the model has dropout": has_dropout(model_config),
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
    """`row_id` = row index: the engines report the update's per-row scores under it."""
    if ROW_ID in batch.columns:
        return batch
    return batch.union(DataProto.from_dict({ROW_ID: torch.arange(len(batch), dtype=torch.int64)}))


def old_log_probs_from_update(batch: DataProto, row_stats: dict[str, torch.Tensor]) -> DataProto:
    """The batch with `old_log_probs` and `entropys` ([N, T]) from the update's per-row statistics
    (rows with no action token, which the engines drop, stay 0 as the separate forward leaves them)."""
    shape = batch["response_mask"].shape
    columns = {}
    for stat, field in (("log_prob", "old_log_probs"), ("entropy", "entropys")):
        column = torch.zeros(shape, dtype=torch.float32)
        if row_stats:
            column[row_stats[ROW_ID].long()] = row_stats[stat].to(torch.float32)
        columns[field] = column
    return batch.union(DataProto.from_dict(columns))
