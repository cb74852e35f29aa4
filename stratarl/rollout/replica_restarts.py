"""Layer 5, rollout: replacing a replica that died or stopped answering — the decision and the count.

A replica that is lost raises `ReplicaLost` (a rollout replica's process that died or did not answer
its call in time: `cluster.rollout_replica`). A router given `ReplicaRestarts` then asks its `start`
for a new replica in the lost one's place — the same replica id, serving the weight version the
others serve before it answers — and runs the lost call again on it: the same requests with the
same sampling seeds, so the tokens are those the lost replica would have returned (a request's seed
draws from its own generator, whatever else is in the batch: `interface.SamplingParams`). After
`max_restarts` replacements the next loss is raised, saying how many were used.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class ReplicaLost(RuntimeError):
    """A replica was lost: `replica_id`, `cause` ("died" or "timed out") and `why` (the details).
    A router with restarts replaces it; a cluster's error for a lost replica process is one too."""

    def __init__(self, message: str, *, replica_id: int = 0, cause: str = "died", why: str = ""):
        super().__init__(message)
        self.replica_id, self.cause, self.why = replica_id, cause, why or message

    def after_restarts(self, used: int, limit: int) -> ReplicaLost:
        """The same loss, once every allowed restart was used (the error that stops the run)."""
        return ReplicaLost(
            f"{self}; {used} of {limit} replica restarts used",
            replica_id=self.replica_id,
            cause=self.cause,
            why=self.why,
        )


@dataclass(frozen=True)
class ReplicaRestart:
    """One replacement: which replica, why it was lost (cause: died / timed out), which restart of
    the run it was, the seconds from the loss until the new replica served the others' weights, and
    that weight version."""

    replica_id: int
    cause: str
    why: str
    number: int
    seconds: float
    weight_version: int


class ReplicaRestarts:
    """At most `max_restarts` replacements over a run (0: none, a loss stops the run).

    start(lost replica) -> the replica that takes its place, started the way the lost one was and
    serving the weight version the others serve (the cluster layer's `ReplicaRestarter`).
    """

    def __init__(self, max_restarts: int, start: Callable[[Any], Any]):
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be ≥ 0, got {max_restarts}")
        self.max_restarts, self.start = max_restarts, start
        self.done: list[ReplicaRestart] = []  # every restart of the run, in order
        self._untaken = 0  # restarts since the last `take`
        self._lock = threading.Lock()

    @property
    def used(self) -> int:
        return len(self.done)

    def replace(self, replicas: list[Any], index: int, lost: Any, error: ReplicaLost) -> Any:
        """The replica that now holds `index` of `replicas` in place of `lost` (which `error` lost):
        a new one, or the one a concurrent caller already started for it. Raises
        `error.after_restarts(...)` when the restarts are used up."""
        with self._lock:  # one restart per loss, however many calls saw it
            if replicas[index] is not lost:
                return replicas[index]
            if self.used >= self.max_restarts:
                raise error.after_restarts(self.used, self.max_restarts) from error
            began = time.monotonic()
            new = self.start(lost)
            replicas[index] = new
            self.done.append(
                ReplicaRestart(
                    replica_id=error.replica_id,
                    cause=error.cause,
                    why=error.why,
                    number=self.used + 1,
                    seconds=round(time.monotonic() - began, 3),
                    weight_version=new.weight_version,
                )
            )
            self._untaken += 1
            return new

    def take(self) -> list[ReplicaRestart]:
        """The restarts since the last call."""
        with self._lock:
            taken = self.done[len(self.done) - self._untaken :] if self._untaken else []
            self._untaken = 0
            return taken
