"""Layer 2, control flow: the bounded buffer between rollout producer and trainer (trainer.mode=async).

The producer generates batches, each with one weight version (it holds the rollout while it
generates, so a weight push waits for the batch in flight); the trainer takes one per step. The
staleness of a batch trained at step j is  s = p(j) − v,  p(j) the policy version step j trains
(`version_of(j)`), v the version that generated it. The bound `max_staleness` S holds either way:

    wait: the producer starts the batch meant for step L only once the rollout serves v ≥ p(L) − S,
          so no batch can pass the bound (tinker-cookbook's pacing; nothing is thrown away);
    drop: the producer runs ahead up to `capacity`; the trainer discards batches with s > S and
          counts their rows (verl's `max_off_policy_strategy=drop`).

Without a torch or worker import, so that a test can drive it with any producer and consumer speed.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class ProducerFailed(RuntimeError):
    """The producer thread raised; the trainer re-raises it from its own thread."""


@dataclass
class BufferedBatch:
    step: int  # the step it was produced for (the step that trains it under `wait`)
    version: int  # the rollout version that generated every row
    rows: int
    item: Any = None  # what the producer made (a `batch_sources.ProducedBatch`)


@dataclass
class BufferCounters:
    dropped_rows: int = 0
    dropped_batches: int = 0
    staleness_seen: list[int] = field(default_factory=list)  # of every batch handed to the trainer


class RolloutBuffer:
    """capacity: finished batches held at most; version_of: step -> the policy version it trains;
    rollout_version: what the rollout serves now (raised by `end_push`)."""

    def __init__(
        self,
        *,
        capacity: int,
        max_staleness: int,
        strategy: str,
        version_of: Callable[[int], int],
        rollout_version: int,
        next_step: int,
    ):
        if strategy not in ("wait", "drop"):
            raise ValueError(f"async_training.stale_strategy={strategy!r}; valid: wait, drop")
        self.capacity, self.max_staleness, self.strategy = capacity, max_staleness, strategy
        self.version_of, self.rollout_version = version_of, rollout_version
        self.next_step = next_step  # the step the producer's next batch is meant for
        self.items: deque[BufferedBatch] = deque()
        self.counters = BufferCounters()
        self.producing = self.held = self.stopped = False
        self.error: BaseException | None = None
        self._cond = threading.Condition()

    # --- the producer's side -------------------------------------------------------------------
    def may_start(self, step: int) -> bool:
        """Room in the buffer, the rollout not held, and (wait) the rollout fresh enough for `step`."""
        fresh = self.strategy == "drop" or self.rollout_version >= self.version_of(step) - self.max_staleness
        return len(self.items) < self.capacity and not self.held and fresh

    def begin_produce(self) -> tuple[int, int] | None:
        """Block until the next batch may be generated; (its step, the version it generates with),
        or None once stopped. The rollout is the producer's until `end_produce`."""
        with self._cond:
            self._cond.wait_for(lambda: self.stopped or self.may_start(self.next_step))
            if self.stopped:
                return None
            self.producing = True
            step, self.next_step = self.next_step, self.next_step + 1
            return step, self.rollout_version

    def end_produce(self, batch: BufferedBatch | None, error: BaseException | None = None) -> None:
        with self._cond:
            self.producing = False
            if error is not None:
                self.error = error
            elif batch is not None:
                self.items.append(batch)
            self._cond.notify_all()

    # --- the trainer's side --------------------------------------------------------------------
    def take(self, step: int, timeout: float | None = None) -> tuple[BufferedBatch, int]:
        """The oldest batch fresh enough for `step` and the buffer depth before taking; batches past
        the bound are dropped (counted). Raises `ProducerFailed` when the producer raised."""
        with self._cond:
            while True:
                if not self._cond.wait_for(lambda: self.items or self.error is not None, timeout):
                    raise TimeoutError(f"no batch for step {step} within {timeout} s")
                depth = len(self.items)
                if not self.items:
                    raise ProducerFailed(f"the rollout producer failed: {self.error!r}") from self.error
                batch = self.items.popleft()
                self._cond.notify_all()
                staleness = self.version_of(step) - batch.version
                if staleness <= self.max_staleness:
                    self.counters.staleness_seen.append(staleness)
                    return batch, depth
                self.counters.dropped_rows += batch.rows
                self.counters.dropped_batches += 1

    def hold(self) -> None:
        """Wait for the batch in flight (the rollout serves one version per batch), then keep the
        producer from starting another: for a weight push, validation or a checkpoint."""
        with self._cond:
            self._cond.wait_for(lambda: not self.producing or self.error is not None)
            self.held = True

    def release(self, version: int | None = None) -> None:
        """Let the producer go on; `version`: what the rollout serves now (after a push)."""
        with self._cond:
            self.held = False
            if version is not None:
                self.rollout_version = version
            self._cond.notify_all()

    def restore(self, items: list[BufferedBatch]) -> None:
        """A resumed run's buffer: the batches its checkpoint saved, the producer after them."""
        with self._cond:
            self.items = deque(items)
            if items:
                self.next_step = items[-1].step + 1

    def stop(self) -> None:
        with self._cond:
            self.stopped = True
            self._cond.notify_all()

    def ready(self) -> list[BufferedBatch]:
        """The finished batches not yet taken (what a checkpoint saves)."""
        with self._cond:
            return list(self.items)
