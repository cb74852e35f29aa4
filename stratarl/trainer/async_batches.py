"""Layer 2, control flow: trainer.mode=async — a producer thread collects batches continuously into a
bounded `RolloutBuffer`; the trainer takes one per step, at most `async_training.max_staleness`
versions old, and pushes its weights every `async_training.weight_sync_interval` steps.

Which version generates which batch depends on the two sides' speeds (that is the point of the
mode), so a run is not bit-reproducible; the staleness bound holds whatever the speeds. With
`async_training.deterministic` the schedule is pinned (`RolloutBuffer`: each batch from the oldest
version the bound allows, a push waiting for the batches it owes), and a run reproduces given its
seed. Validation and a checkpoint hold the rollout: the batch in flight finishes first and none
starts until they are done (a checkpoint thus saves the buffer and a sampler position that agree,
and a resume continues from both). A weight push holds it too under partial_rollout=finish (every
batch from one version); under continue it does not: the engine loads the weights between two of its
steps and the running responses go on with them, so a batch's tokens lie between the version it
started with and the newest pushed, and its staleness is counted from its oldest token.
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
    Collector,
    OverlapMeter,
    ProducedBatch,
    produce,
    producer_collector,
    push,
    release_rows,
)
from stratarl.trainer.rollout_buffer import BufferedBatch, RolloutBuffer
from stratarl.transport.data_proto import DataProto

JOIN_TIMEOUT_S = 5.0  # how long `close` waits for the batch in flight (then the daemon thread is left)


class AsyncBatches:
    """version_of: step -> the policy version it trains; rollout_version: what the rollout serves
    at the start; first_step: the first step this process trains."""

    def __init__(
        self,
        collector: Collector,
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
        partial_rollout: str = "finish",
    ):
        self.collector, self.worker, self.monitor = producer_collector(collector), worker, monitor
        self.meter, self.sync_interval = OverlapMeter(), sync_interval
        self.partial_rollout = partial_rollout
        self.newest = rollout_version  # the newest version pushed or being pushed
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
                oldest = check_versions(produced, version, self.newest)
            except BaseException as error:  # handed to the trainer, which raises it in its thread
                self.buffer.end_produce(None, error)
                return
            self.buffer.end_produce(BufferedBatch(step, oldest, len(produced.batch), produced))

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
        flight (partial_rollout=finish) or into it (continue); {} on other steps."""
        if not force and step % self.sync_interval:
            return {}
        self.newest = version  # before the push: a token may carry it as soon as it lands
        if self.partial_rollout == "continue":
            metrics = push(self.worker, self.monitor, step, version, timings)
            self.buffer.advance(version)
            return metrics
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

    def release(self, produced: ProducedBatch) -> None:
        release_rows(self.worker, produced)

    def close(self) -> None:
        self.buffer.stop()
        if self.thread is not None:
            self.thread.join(timeout=JOIN_TIMEOUT_S)


def check_versions(produced: ProducedBatch, version: int, newest: int) -> int:
    """Every token of the batch must come from a version between the one the rollout served when
    the producer started it and the newest pushed since (equal under partial_rollout=finish, which
    holds the rollout); returns the oldest version of its rows (what its staleness counts from)."""
    rows, seen = produced.batch["weight_version"], set(produced.batch["weight_version"].tolist())
    if "token_weight_version" in produced.batch:
        tokens = produced.batch["token_weight_version"]
        seen |= set(tokens[tokens >= 0].tolist())  # -1: observation and padding tokens
    seen = sorted(seen)
    if seen[0] < version or seen[-1] > newest:
        raise RuntimeError(
            f"batch for step {produced.step}: tokens carry weight versions {seen}, but the rollout served "
            f"versions {version}..{newest} while it generated them"
        )
    return int(rows.min())


def _materialized(item: ProducedBatch, materialize: Callable[[DataProto], DataProto]) -> ProducedBatch:
    return dataclasses.replace(item, batch=materialize(item.batch))
