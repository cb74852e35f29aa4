"""Layer 2, control flow: where a step's batch comes from, and when weights reach the rollout (trainer.mode).

    sync          step k: collect (generate, score) with weights k−1, train, push → version k
    one_step_off  step k: take the batch a producer thread collected with weights k−2 (the previous
                  step's), start collecting step k+1's with weights k−1, train; the push waits for
                  that batch first (verl's one_step_off_policy: staleness exactly 1 after step 1)
    async         a producer thread fills a bounded buffer (`async_batches.AsyncBatches`)

Every source returns `ProducedBatch`es and counts how long the rollout and the trainer were busy
(`OverlapMeter`: the async/* metrics). The producer runs the same `Collector` (the step's collect
half, `step.RLStep.collect`) on its own copy of the step tracer; its phases (gen, reward) are under
the run's watchdog like the trainer's, and the trainer's wait for it is the phase `wait_rollout`, so
a stalled producer is named, not a silent hang.
The engine records the version of every token (`token_weight_version`); a row's `weight_version` is
its oldest. Rows span versions only under async with partial_rollout=continue.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from stratarl.cluster.handles import PolicyHandle
from stratarl.observe.phase_monitor import PhaseMonitor
from stratarl.observe.trace_store import StepTrace
from stratarl.trainer import phases
from stratarl.trainer.tracing import StepTracer
from stratarl.transport.data_proto import DataProto

PRODUCER_THREAD = "stratarl-rollout"


@dataclass
class ProducedBatch:
    """One step's scored rows and what collecting them recorded."""

    step: int  # the step it was collected for (its seeds and uids derive from it)
    batch: DataProto
    metrics: dict[str, float]  # reward/*, batch/* of the collect phase
    timings: dict[str, float]  # gen, reward, ... (seconds), merged into the training step's timings
    trace: StepTrace | None  # the trace rows of rollout and reward (None: trace.enable=false)

    def add_timings(self, timings: dict[str, float]) -> None:
        """Add the collect phases' seconds to the training step's `timings`."""
        for name, seconds in self.timings.items():
            timings[name] = timings.get(name, 0.0) + seconds


class Collector(Protocol):
    """What a batch source runs to collect a step's batch: the first half of the step
    (`step.RLStep.collect`), with the tracer and policy it collects with."""

    tracer: StepTracer
    worker: PolicyHandle

    def collect(self, step: int, timings: dict[str, float]) -> tuple[DataProto, dict[str, float]]: ...


def produce(collector: Collector, step: int) -> ProducedBatch:
    """Collect step `step`'s batch with `collector`, its trace rows detached from the collector's
    tracer (the step that trains it adopts them)."""
    timings: dict[str, float] = {}
    collector.tracer.begin(step)
    with collector.worker.queue_collection(step):  # its TransferQueue rows are step `step`'s
        batch, metrics = collector.collect(step, timings)
    trace, collector.tracer.current = collector.tracer.current, None
    return ProducedBatch(step, batch, metrics, timings, trace)


def producer_collector(collector: Collector) -> Collector:
    """The collector the producer thread runs: the same data, policy and reward, its own tracer state."""
    return dataclasses.replace(collector, tracer=copy.copy(collector.tracer))


class BusyClock:
    """Seconds a side spent busy, including a stretch still running (thread-safe)."""

    def __init__(self) -> None:
        self.total, self.since = 0.0, None
        self._lock = threading.Lock()

    @contextmanager
    def busy(self) -> Iterator[None]:
        with self._lock:
            self.since = time.perf_counter()
        try:
            yield
        finally:
            with self._lock:
                self.total, self.since = self.total + time.perf_counter() - self.since, None

    def read(self, now: float) -> float:
        with self._lock:
            return self.total + (now - self.since if self.since is not None else 0.0)


class OverlapMeter:
    """Per step (the time since the previous step's metrics): how long the rollout worked, how long
    the trainer waited for it, and how much of the window both were busy."""

    def __init__(self) -> None:
        self.rollout, self.trainer_wait = BusyClock(), BusyClock()
        self.last = (time.perf_counter(), 0.0, 0.0)

    def take_metrics(self) -> dict[str, float]:
        now = time.perf_counter()
        then, rollout_then, wait_then = self.last
        window = max(now - then, 1e-9)
        rollout = self.rollout.read(now) - rollout_then
        wait = self.trainer_wait.read(now) - wait_then
        self.last = (now, rollout + rollout_then, wait + wait_then)
        overlap = max(0.0, rollout + (window - wait) - window)  # both busy: |R ∩ T| = R + T − window
        return {
            "async/rollout_busy_s": rollout,
            "async/rollout_idle_s": max(0.0, window - rollout),
            "async/trainer_idle_s": wait,
            "async/overlap_s": overlap,
            "async/overlap_ratio": overlap / window,
        }


def staleness_metrics(batch: DataProto, trained_version: int) -> dict[str, float]:
    """async/staleness_{mean,min,max}: trained version − generating version over the batch's rows
    (a row's generating version: its oldest token's). With `token_weight_version`, over the sampled
    tokens too: async/token_staleness_{mean,max}, and async/partial_rows, the rows whose tokens come
    from more than one version (a response continued across a push)."""
    staleness = (trained_version - batch["weight_version"]).double()
    metrics = {
        "async/staleness_mean": staleness.mean().item(),
        "async/staleness_min": staleness.min().item(),
        "async/staleness_max": staleness.max().item(),
    }
    if "token_weight_version" not in batch:
        return metrics
    versions = batch["token_weight_version"]  # [N, T]
    sampled = batch["response_mask"].bool() & (versions >= 0)
    if not sampled.any():
        return metrics
    token_staleness = (trained_version - versions[sampled]).double()  # [tokens]
    newest = versions.masked_fill(~sampled, -1).max(dim=-1).values  # [N]
    oldest = versions.masked_fill(~sampled, torch.iinfo(versions.dtype).max).min(dim=-1).values
    return metrics | {
        "async/token_staleness_mean": token_staleness.mean().item(),
        "async/token_staleness_max": token_staleness.max().item(),
        "async/partial_rows": float(((newest > oldest) & sampled.any(dim=-1)).sum()),
    }


def release_rows(worker: PolicyHandle, produced: ProducedBatch) -> None:
    """Ray: the rows collected for steps ≤ `produced.step` leave the TransferQueue (verl's kv_clear
    at the end of a step); nothing without a queue."""
    worker.clear_queue(through=produced.step)


def push(worker: PolicyHandle, monitor: PhaseMonitor, step: int, version: int, timings: dict) -> dict:
    with monitor.phase("update_weights", timings, step=step):
        return phases.sync_weights(worker, version=version)


class BatchSource(Protocol):
    """What the trainer asks of trainer.mode each step: its batch, the weight push, a pause around
    validation and checkpoints, what a checkpoint saves, and the overlap metrics (`meter`)."""

    meter: OverlapMeter

    def take(self, step: int, timings: dict[str, float]) -> tuple[ProducedBatch, dict[str, float]]:
        """(the step's batch, async/* metrics of taking it); the wait is timed into `timings`."""
        ...

    def push_weights(self, step: int, version: int, timings: dict[str, float], *, force: bool) -> dict:
        """Push the actor's weights as `version` when the mode pushes after `step` (always when
        `force`d: before a validation or a checkpoint); the sync metrics, or {}."""
        ...

    def paused(self, step: int) -> contextlib.AbstractContextManager[None]:
        """Nothing is generated while the block runs (validation, a checkpoint)."""
        ...

    def release(self, produced: ProducedBatch) -> None:
        """The trained batch's rows leave the TransferQueue (and any dropped before it), not those
        of batches collected ahead (`release_rows`)."""
        ...

    def state_dict(self, materialize: Callable[[DataProto], DataProto]) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class SyncBatches:
    """trainer.mode=sync: the step collects its own batch, and every step pushes its weights."""

    def __init__(self, collector: Collector, worker: PolicyHandle, monitor: PhaseMonitor):
        self.collector, self.worker, self.monitor = collector, worker, monitor
        self.meter = OverlapMeter()

    def take(self, step: int, timings: dict[str, float]) -> tuple[ProducedBatch, dict[str, float]]:
        """(the step's batch, async/* metrics of taking it)."""
        with self.meter.rollout.busy(), self.meter.trainer_wait.busy():
            produced = produce(self.collector, step)
        return produced, {"async/buffer_depth": 0.0}

    def push_weights(self, step: int, version: int, timings: dict[str, float], *, force: bool) -> dict:
        return push(self.worker, self.monitor, step, version, timings)

    def paused(self, step: int) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # nothing generates outside the step

    def release(self, produced: ProducedBatch) -> None:
        release_rows(self.worker, produced)

    def state_dict(self, materialize: Callable[[DataProto], DataProto]) -> dict[str, Any]:
        return {"mode": "sync", "ready": []}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None

    def close(self) -> None:
        return None


class OneStepOffBatches:
    """trainer.mode=one_step_off: step k+1's batch is collected by a producer thread, with the
    weights step k starts from, while step k trains.

    Deterministic given the seed: each batch's prompts, seeds and weights are fixed by its step (the
    push after step k waits for batch k+1), whatever the two threads' speeds."""

    def __init__(
        self, collector: Collector, worker: PolicyHandle, monitor: PhaseMonitor, *, total_steps: int
    ):
        self.collector, self.worker, self.monitor = producer_collector(collector), worker, monitor
        self.meter, self.total_steps = OverlapMeter(), total_steps
        # The producer's torch ops run with the trainer's thread count: the same kernels either way.
        self.executor = ThreadPoolExecutor(
            1, PRODUCER_THREAD, initializer=torch.set_num_threads, initargs=(torch.get_num_threads(),)
        )
        self.pending: Future[ProducedBatch] | None = None

    def _start(self, step: int) -> None:
        def run() -> ProducedBatch:
            with self.meter.rollout.busy():
                return produce(self.collector, step)

        self.pending = self.executor.submit(run)

    def _wait(self, step: int, timings: dict[str, float]) -> ProducedBatch:
        with self.monitor.phase("wait_rollout", timings, step=step), self.meter.trainer_wait.busy():
            return self.pending.result()

    def take(self, step: int, timings: dict[str, float]) -> tuple[ProducedBatch, dict[str, float]]:
        depth = float(self.pending is not None and self.pending.done())
        if self.pending is None:  # the first step (nothing was collected ahead): collect it now
            self._start(step)
        produced = self._wait(step, timings)
        self.pending = None
        if step < self.total_steps:
            self._start(step + 1)  # with the weights this step starts from
        return produced, {"async/buffer_depth": depth}

    def push_weights(self, step: int, version: int, timings: dict[str, float], *, force: bool) -> dict:
        if self.pending is not None:  # the next batch is generated with the old weights, all of it
            self._wait(step, timings)
        return push(self.worker, self.monitor, step, version, timings)

    def paused(self, step: int) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # between steps the next batch is complete (the push waited)

    def release(self, produced: ProducedBatch) -> None:
        release_rows(self.worker, produced)

    def state_dict(self, materialize: Callable[[DataProto], DataProto]) -> dict[str, Any]:
        """The batch collected for the next step (the push waited for it): a resume trains on it."""
        if self.pending is None:
            return {"mode": "one_step_off", "ready": []}
        produced = self.pending.result()
        saved = dataclasses.replace(produced, batch=materialize(produced.batch))
        return {"mode": "one_step_off", "ready": [saved]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["mode"] != "one_step_off" or not state["ready"]:
            return
        self.pending = Future()
        self.pending.set_result(state["ready"][0])

    def close(self) -> None:
        # Not joined: a producer stalled past its deadline must not keep the run from stopping (the
        # watchdog's grace ends the process then); one that finishes its batch ends by itself.
        self.executor.shutdown(wait=False, cancel_futures=True)
