"""Layer 2, control flow: trainer.mode as objects — the step's batch source, and the rollout correction
that off-policy samples get (decoupled PPO with the behaviour policy's log-probs, arXiv:2110.00641).

In an off-policy mode, π_rollout (the weights that generated a sample, `rollout_log_probs`) is older
than π_old (the weights the step starts from, recomputed as `old_log_probs`): with
async_training.correction=decoupled the loss clips the ratio π_θ/π_old (the proximal policy) and
weights each token by min(π_old/π_rollout, C) (token TIS, C = rollout_is_threshold), unless
algorithm.rollout_correction configures its own weights or rejection, or bypass mode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stratarl.cluster.handles import PolicyHandle
from stratarl.config import RunConfig
from stratarl.observe.phase_monitor import PhaseMonitor
from stratarl.trainer import builders
from stratarl.trainer.async_batches import AsyncBatches
from stratarl.trainer.batch_sources import BatchSource, OneStepOffBatches, SyncBatches
from stratarl.trainer.collect import BatchCollector


def correction_settings(cfg: RunConfig) -> dict[str, Any] | None:
    """Keyword arguments of the decoupled correction the step applies before advantages; None: none
    (bypass mode corrects inside the loss instead)."""
    rc = cfg.algorithm.rollout_correction
    if rc.bypass_mode:
        return None
    settings = builders.rollout_correction_settings(cfg)
    if rc.rollout_is or rc.rollout_rs:
        return settings
    if cfg.trainer.mode != "sync" and cfg.async_training.correction == "decoupled":
        return settings | {"rollout_is": "token"}
    return None


def build_batch_source(
    cfg: RunConfig,
    collector: BatchCollector,
    worker: PolicyHandle,
    monitor: PhaseMonitor,
    *,
    total_steps: int,
    version_of: Callable[[int], int],
    first_step: int,
) -> BatchSource:
    """The source of trainer.mode; `version_of(step)` is the policy version step trains."""
    mode = cfg.trainer.mode
    if mode == "sync":
        return SyncBatches(collector, worker, monitor)
    if mode == "one_step_off":
        return OneStepOffBatches(collector, worker, monitor, total_steps=total_steps)
    a = cfg.async_training
    return AsyncBatches(
        collector,
        worker,
        monitor,
        max_staleness=a.max_staleness,
        strategy=a.stale_strategy,
        pinned=a.deterministic,
        capacity=a.buffer_batches,
        sync_interval=a.weight_sync_interval,
        version_of=version_of,
        rollout_version=worker.weight_version,
        first_step=first_step,
        partial_rollout=a.partial_rollout,
    )
