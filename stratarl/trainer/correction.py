"""Layer 2, control flow: the off-policy correction a step applies before its advantages — decoupled
PPO with the behaviour policy's log-probs (arXiv:2110.00641), verl's
`compute_rollout_correction_and_add_to_batch`.

In an off-policy mode, π_rollout (the weights that generated a sample, `rollout_log_probs`) is older
than π_old (the weights the step starts from, recomputed as `old_log_probs`): with
async_training.correction=decoupled the loss clips the ratio π_θ/π_old (the proximal policy) and
each token is weighted by min(π_old/π_rollout, C) (token TIS, C = rollout_is_threshold), unless
algorithm.rollout_correction configures its own weights or rejection. Bypass mode corrects inside
the loss instead (`ActorLoss.bypass_correction`), so the step is given `NoCorrection` then.
"""

from __future__ import annotations

from typing import Any

from stratarl.algo.rollout_correction import rollout_correction
from stratarl.assembly import algorithm
from stratarl.config import RunConfig
from stratarl.transport.data_proto import DataProto
from stratarl.transport.field_checks import validate


class NoCorrection:
    """On-policy samples (or bypass mode): the batch as it is."""

    def __call__(self, batch: DataProto) -> tuple[DataProto, dict[str, float]]:
        return batch, {}


class DecoupledCorrection:
    """Three policies: IS weights π_old/π_rollout (when `rollout_is`) and a rejection mask (when
    `rollout_rs`) replacing `response_mask`, before advantages are computed."""

    def __init__(self, settings: dict[str, Any]):
        self.settings = dict(settings)  # keyword arguments of `algo.rollout_correction.rollout_correction`

    def __call__(self, batch: DataProto) -> tuple[DataProto, dict[str, float]]:
        validate(batch, reads=["old_log_probs", "rollout_log_probs", "response_mask"], phase="advantage")
        weights, mask, metrics = rollout_correction(
            batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"], **self.settings
        )
        columns = {"response_mask": mask.to(batch["response_mask"].dtype)}
        if weights is not None:
            columns["rollout_is_weights"] = weights
        kept = batch.select([c for c in batch.columns if c not in columns])
        return kept.union(DataProto.from_dict(columns)), metrics


def correction_settings(cfg: RunConfig) -> dict[str, Any] | None:
    """Keyword arguments of the decoupled correction the step applies before advantages; None: none
    (bypass mode corrects inside the loss instead)."""
    rc = cfg.algorithm.rollout_correction
    if rc.bypass_mode:
        return None
    settings = algorithm.rollout_correction_settings(cfg)
    if rc.rollout_is or rc.rollout_rs:
        return settings
    if cfg.trainer.mode != "sync" and cfg.async_training.correction == "decoupled":
        return settings | {"rollout_is": "token"}
    return None


def build_correction(cfg: RunConfig) -> NoCorrection | DecoupledCorrection:
    settings = correction_settings(cfg)
    return NoCorrection() if settings is None else DecoupledCorrection(settings)
