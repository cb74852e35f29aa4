"""Layer 3, orchestration: a role's ranks as Ray actors, and how one call reaches them.

Each rank is a `rank_process.RankProcess` actor holding the role's worker. `call(phase, method,
per_rank)` runs `method(worker, ...)` on every rank concurrently (the same worker functions the
in-process backend calls) and waits at most `timeout_s`: a rank that died, raised or hung becomes
one `WorkerError` naming the role, the ranks and the phase. The group is then stopped — the other
ranks of a collective would wait on the failed one — and the run resumes from its last checkpoint.
`RayRanks` also counts the bytes that pass through the controller.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import ray
from ray import cloudpickle

from stratarl.cluster.ranks import Call, ControllerTraffic, Method, WorkerError, check_arity


def wire_bytes(obj: Any) -> int:
    """The serialized size of `obj` (pickle protocol 5; large buffers are measured, not copied)."""
    buffers: list[int] = []
    head = cloudpickle.dumps(obj, protocol=5, buffer_callback=lambda b: buffers.append(b.raw().nbytes))
    return len(head) + sum(buffers)


class RayRanks:
    """Ranks that are `RankProcess` Ray actors (rank i = actors[i]).

    timeout_s: the longest any call may take before the ranks still running count as hung.
    grace_s: after a first failure, how long to wait for the other ranks' outcome (a collective's
        peers fail soon after one of them dies), so that the error names every failed rank.
    """

    def __init__(self, role: str, actors: Sequence[Any], *, timeout_s: float, grace_s: float = 5.0):
        if not actors:
            raise ValueError(f"{role}: a worker group needs at least one rank")
        self.role, self.actors = role, list(actors)
        self.timeout_s, self.grace_s = timeout_s, grace_s
        self.traffic = ControllerTraffic()
        self.stopped: str | None = None  # why the group was stopped
        self.nodes: list[str] = []  # the Ray node id of each rank, once started

    @property
    def size(self) -> int:
        return len(self.actors)

    def call(self, phase: str, method: Method, per_rank: Sequence[Call]) -> list[Any]:
        """`method(worker, *args, **kwargs)` on every rank's worker, with that rank's arguments."""
        check_arity(self.role, self.size, per_rank)
        if self.stopped is not None:
            raise WorkerError(
                self.role, phase, dict.fromkeys(range(self.size), f"not called: {self.stopped}")
            )
        self.traffic.sent += sum(wire_bytes(call) for call in per_rank)
        refs = [
            actor.run.remote(method, *args, **kwargs)
            for actor, (args, kwargs) in zip(self.actors, per_rank, strict=True)
        ]
        results = self._wait(phase, refs)
        self.traffic.received += sum(wire_bytes(result) for result in results)
        return results

    def call_all(self, phase: str, method: Method, *args: Any, **kwargs: Any) -> list[Any]:
        """One-to-all: the same arguments to every rank (save, load, weight sync)."""
        return self.call(phase, method, [(args, kwargs)] * self.size)

    def call_processes(
        self, phase: str, method: Method, *args: Any, ranks: Sequence[int] | None = None
    ) -> list:
        """`method(rank_process, *args)` on the rank processes themselves (start-up: their node, the
        rendezvous, joining the group), on every rank or on `ranks`."""
        ranks = list(range(self.size)) if ranks is None else list(ranks)
        refs = [self.actors[r].__ray_call__.remote(method, *args) for r in ranks]
        return self._wait(phase, refs, ranks)

    def pids(self) -> list[int]:
        """The process id of every rank (for diagnosis, and for the tests that kill one)."""
        return self._wait("pids", [actor.__ray_call__.remote(_pid) for actor in self.actors])

    def _wait(self, phase: str, refs: list[ray.ObjectRef], ranks: Sequence[int] | None = None) -> list[Any]:
        """The results of `refs` (the calls of `ranks`, default all) in order, or `WorkerError`."""
        ranks = list(range(len(refs))) if ranks is None else list(ranks)
        deadline = time.monotonic() + self.timeout_s
        pending = dict(zip(refs, ranks, strict=True))
        results: dict[int, Any] = {}
        reasons: dict[int, str] = {}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            rank = pending.pop(ready[0])
            try:
                results[rank] = ray.get(ready[0])
            except ray.exceptions.RayActorError as error:
                reasons[rank] = f"died ({error_summary(error)})"
            except ray.exceptions.RayTaskError as error:
                cause = getattr(error, "cause", None) or error
                reasons[rank] = f"raised {type(cause).__name__}: {error_summary(cause)}"
            if reasons:  # peers of a failed rank fail soon after, or hang in a collective
                deadline = min(deadline, time.monotonic() + self.grace_s)
        for rank in pending.values():
            reasons[rank] = f"did not answer within {self.timeout_s:g} s (hung or still busy)"
        if reasons:
            self.stop(f"{self.role} ranks {sorted(reasons)} failed in phase {phase!r}")
            raise WorkerError(self.role, phase, reasons)
        return [results[rank] for rank in ranks]

    def stop(self, reason: str = "stopped") -> None:
        """Kill every rank's process; later calls raise at once. (After the cluster ended, with the
        policy group's shutdown, the processes are gone already.)"""
        if self.stopped is None:
            self.stopped = reason
        if not ray.is_initialized():
            return
        for actor in self.actors:
            ray.kill(actor, no_restart=True)


def error_summary(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else type(error).__name__


def _pid(process: Any) -> int:
    return os.getpid()
