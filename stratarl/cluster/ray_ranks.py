"""Layer 3, orchestration: a role's ranks as Ray actors, and how one call reaches them.

Each rank is a `rank_process.RankProcess` actor holding the role's worker. `call(phase, method,
per_rank)` runs `method(worker, ...)` on every rank concurrently (the same worker functions the
in-process backend calls) and waits at most `timeout_s`: a rank that died, raised or hung becomes
one `WorkerError` naming the role, the ranks and the phase. The group is then stopped — the other
ranks of a collective would wait on the failed one — and the run resumes from its last checkpoint.
`RayRanks` also counts the bytes that pass through the controller, remembers the last call each
rank received, and — once armed (`arm_stack_dumps`) — has every rank dump its Python stacks into
the run's hang folder before a hung group is stopped (and on the watchdog's request).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ray
from ray import cloudpickle

from stratarl.cluster.ranks import Call, ControllerTraffic, Method, WorkerError, check_arity
from stratarl.observe.stack_dumps import BUSY, ArmedProcess, arm_stack_dumps, dump_armed
from stratarl.transport.data_proto import DataProto

WAIT_POLL_S = 1.0  # the longest single wait: between waits the controller's signal handlers run


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
        self.last_calls: dict[int, dict[str, Any]] = {}  # rank -> the last call it received
        self.armed: list[ArmedProcess] = []  # ranks whose stacks can be dumped (arm_stack_dumps)
        self.hang_dir: Path | None = None

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
        for rank, (args, _) in enumerate(per_rank):
            record_call(self.last_calls, rank, phase, method.__name__, args)
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
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            # Short waits: between them the controller's signal handlers run (the watchdog's interrupt).
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=min(remaining, WAIT_POLL_S))
            if not ready:
                continue
            rank = pending.pop(ready[0])
            record_answer(self.last_calls, rank)
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
            error = WorkerError(self.role, phase, reasons)
            self.record_failure(error, dump=bool(pending))  # hung ranks: stacks while they still exist
            self.stop(f"{self.role} ranks {sorted(reasons)} failed in phase {phase!r}")
            raise error
        return [results[rank] for rank in ranks]

    # --- stack dumps -------------------------------------------------------------------------------
    def arm_stack_dumps(self, folder: str | Path) -> list[str]:
        """Every rank registers faulthandler on SIGUSR1, writing to folder/ranks/ (`stack_dumps`); a
        hang then leaves every rank's stacks. Returns a line per rank."""
        self.hang_dir = Path(folder)
        armed = self.call_processes("watchdog", register_stack_dump, str(self.hang_dir / "ranks"), self.role)
        self.armed = [
            ArmedProcess(self.role, rank, int(a["pid"]), str(a["path"])) for rank, a in enumerate(armed)
        ]
        return [f"{p.name}: pid {p.pid}" for p in self.armed]

    def dump_stacks(self, folder: str | Path, header: str) -> list[str]:
        """Every armed rank's stacks into `folder`, each line with the last call the rank received."""
        return dump_armed(self.armed, folder, header, describe_calls(self.last_calls))

    def record_failure(self, error: WorkerError, *, dump: bool) -> Path | None:
        """A failed phase's report (and, for hung ranks, their stacks) under the hang folder, for
        `stratarl doctor`; nothing when the group was never armed."""
        if self.hang_dir is None:
            return None
        folder = self.hang_dir / f"{self.role}-{error.phase.replace('.', '_')}-{int(time.time())}"
        lines = self.dump_stacks(folder, f"{error}") if dump and self.armed else []
        folder.mkdir(parents=True, exist_ok=True)
        report = {
            "message": str(error),
            "role": self.role,
            "phase": error.phase,
            "reasons": {str(rank): why for rank, why in error.reasons.items()},
            "last_calls": {str(rank): call for rank, call in self.last_calls.items()},
            "processes": lines,
        }
        (folder / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        return folder

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


def register_stack_dump(process: Any, folder: str, role: str) -> dict[str, object]:
    """faulthandler on SIGUSR1 from now on: this rank process's stacks into `folder` (`stack_dumps`)."""
    return arm_stack_dumps(folder, role, process.rank)


def record_call(
    calls: dict[int, dict[str, Any]] | None, rank: int, phase: str, method: str, args: Sequence[Any]
) -> None:
    """Remember the call rank `rank` received last (what a hang report shows for it); None: no record."""
    if calls is None:
        return
    calls[rank] = {"phase": phase, "method": method, "rows": _rows_in(args), "at": time.time()}


def record_answer(calls: dict[int, dict[str, Any]] | None, rank: int) -> None:
    if calls is not None and rank in calls and "answered_after_s" not in calls[rank]:
        calls[rank]["answered_after_s"] = round(time.time() - calls[rank]["at"], 3)


def describe_calls(calls: dict[int, dict[str, Any]]) -> dict[int, str]:
    return {rank: _describe_call(call) for rank, call in calls.items()}


def _rows_in(args: Sequence[Any]) -> int | None:
    """Rows of the first batch (a DataProto, or a TransferQueue shard reference) among a call's args."""
    for arg in args:
        if isinstance(arg, DataProto):
            return len(arg)
        rows = getattr(arg, "rows", None)
        if isinstance(rows, tuple):
            return len(rows)
    return None


def _describe_call(call: Mapping[str, Any]) -> str:
    rows = f", {call['rows']} rows" if call.get("rows") is not None else ""
    age = time.time() - call["at"]
    state = f"answered after {call['answered_after_s']:g} s" if "answered_after_s" in call else BUSY
    return f"last call {call['method']} in phase {call['phase']!r}{rows}, {age:.1f} s ago, {state}"
