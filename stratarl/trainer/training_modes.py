"""Layer 2, control flow: trainer.mode as an object — the step's batch source (`batch_sources`).

sync          the step collects its own batch (`SyncBatches`)
one_step_off  a producer thread collects the next step's batch while this one trains
async         a producer thread fills a bounded buffer (`async_batches.AsyncBatches`)
"""

from __future__ import annotations

from collections.abc import Callable

from stratarl.cluster.handles import PolicyHandle
from stratarl.config import RunConfig
from stratarl.observe.phase_monitor import PhaseMonitor
from stratarl.trainer.async_batches import AsyncBatches
from stratarl.trainer.batch_sources import BatchSource, Collector, OneStepOffBatches, SyncBatches


def build_batch_source(
    cfg: RunConfig,
    collector: Collector,
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
