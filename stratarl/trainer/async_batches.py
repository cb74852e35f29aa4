"""Layer 2, control flow: trainer.mode=async — a producer thread collects batches continuously into a
bounded `RolloutBuffer`; the trainer takes one per step, at most `async_training.max_staleness`
versions old, and pushes its weights every `async_training.weight_sync_interval` steps.

Which version generates which batch depends on the two sides' speeds (that is the point of the
mode), so a run is not bit-reproducible; the staleness bound holds whatever the speeds. With
`async_training.deterministic` the schedule is pinned (`RolloutBuffer`: each batch from the oldest
version the bound allows, a push waiting for the batches it owes), and a run reproduces given its
seed. A weight push, validation and a checkpoint each hold the rollout: the batch in flight finishes first and
none starts until they are done (a checkpoint thus saves the buffer and a sampler position that
agree, and a resume continues from both).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from stratarl.cluster.handles import PolicyHandle
from stratarl.observe.phase_monitor import PhaseMonitor
from stratarl.trainer.batch_sources import (
    PRODUCER_THREAD,
    OverlapMeter,
    ProducedBatch,
    produce,
    producer_collector,
    push,
)
from stratarl.trainer.collect import BatchCollector
from stratarl.trainer.rollout_buffer import BufferedBatch, RolloutBuffer
from stratarl.transport.data_proto import DataProto

JOIN_TIMEOUT_S = 5.0  # how long `close` waits for the batch in flight (then the daemon thread is left)


class AsyncBatches:
    """version_of: step -> the policy version it trains; rollout_version: what the rollout serves
    at the start; first_step: the first step this process trains."""

    def __init__(
        self,
        collector: BatchCollector,
        worker: PolicyHandle,
        monitor: PhaseMonitor,
        *,
        max_staleness: int,
        strategy: str,
        pinned: bool,
        capacity: int,
        sync_interval: int,
        version_of: Callable[[int], int],
        rollout_version: int,
        first_step: int,
    ):
        self.collector, self.worker, self.monitor = producer_collector(collector), worker, monitor
        self.meter, self.sync_interval = OverlapMeter(), sync_interval
        self.buffer = RolloutBuffer(
            capacity=capacity,
            max_staleness=max_staleness,
            strategy=strategy,
            pinned=pinned,
            version_of=version_of,
            rollout_version=rollout_version,
            next_step=first_step,
        )
        self.threads = torch.get_num_threads()
        self.thread: threading.Thread | None = None

    def _run(self) -> None:
        torch.set_num_threads(self.threads)  # the producer's kernels use the trainer's thread count
        while True:
            started = self.buffer.begin_produce()
            if started is None:
                return
            step, version = started
            try:
                with self.meter.rollout.busy():
                    produced = produce(self.collector, step)
                check_versions(produced, version)
            except BaseException as error:  # handed to the trainer, which raises it in its thread
                self.buffer.end_produce(None, error)
                return
            self.buffer.end_produce(BufferedBatch(step, version, len(produced.batch), produced))

    def take(self, step: int, timings: dict[str, float]) -> tuple[ProducedBatch, dict[str, float]]:
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name=PRODUCER_THREAD, daemon=True)
            self.thread.start()
        before = self.buffer.counters.dropped_rows
        with self.monitor.phase("wait_rollout", timings, step=step), self.meter.trainer_wait.busy():
            buffered, depth = self.buffer.take(step)
        if buffered.item.trace is not None:  # under drop, a batch may train at an earlier step than planned
            buffered.item.trace.step = step
        metrics = {
            "async/buffer_depth": float(depth),
            "async/dropped_samples": float(self.buffer.counters.dropped_rows - before),
            "async/dropped_samples_total": float(self.buffer.counters.dropped_rows),
        }
        return buffered.item, metrics

    def push_weights(self, step: int, version: int, timings: dict[str, float], *, force: bool) -> dict:
        """Every `sync_interval` steps (and when `force`d: a checkpoint step), after the batch in
        flight; {} on other steps."""
        if not force and step % self.sync_interval:
            return {}
        with self.monitor.phase("wait_rollout", timings, step=step), self.meter.trainer_wait.busy():
            self.buffer.hold(before_push=True)
        try:
            metrics = push(self.worker, self.monitor, step, version, timings)
        except BaseException:
            self.buffer.release()
            raise
        self.buffer.release(version)
        return metrics

    @contextmanager
    def paused(self, step: int) -> Iterator[None]:
        with self.monitor.phase("wait_rollout", step=step):
            self.buffer.hold()
        try:
            yield
        finally:
            self.buffer.release()

    def state_dict(self, materialize: Callable[[DataProto], DataProto]) -> dict[str, Any]:
        """The finished batches in the buffer (taken while `paused`: none is in flight)."""
        ready = [
            BufferedBatch(b.step, b.version, b.rows, _materialized(b.item, materialize))
            for b in self.buffer.ready()
        ]
        return {"mode": "async", "ready": ready}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["mode"] == "async":
            self.buffer.restore(state["ready"])

    def close(self) -> None:
        self.buffer.stop()
        if self.thread is not None:
            self.thread.join(timeout=JOIN_TIMEOUT_S)


def check_versions(produced: ProducedBatch, version: int) -> None:
    """Every row of the batch must come from the version the producer held the rollout at."""
    versions = produced.batch["weight_version"]
    if not bool((versions == version).all()):
        raise RuntimeError(
            f"batch for step {produced.step}: rows carry weight versions {sorted(set(versions.tolist()))}, "
            f"but the rollout was held at version {version} while it generated them"
        )


def _materialized(item: ProducedBatch, materialize: Callable[[DataProto], DataProto]) -> ProducedBatch:
    return dataclasses.replace(item, batch=materialize(item.batch))
