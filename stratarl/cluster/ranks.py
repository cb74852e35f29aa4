"""Layer 3, orchestration: the ranks of a role, and how one call reaches them — in this process or on Ray.

A worker group (`worker_group`) decides what each rank receives; a ranks backend delivers it:
`call(phase, method, per_rank)` runs `method` on every rank with that rank's arguments and returns
the results in rank order. `InProcessRanks` calls plain objects (the embedded backend).
`RayRanks` calls Ray actors concurrently and waits at most `timeout_s`: a rank that died, raised
or hung becomes one `WorkerError` naming the role, the ranks and the phase. The group is then
stopped — the other ranks of a collective would wait on the failed one — and the run resumes from
its last checkpoint. `RayRanks` also counts the bytes that pass through the controller, remembers
the last call each rank received, and — once armed (`arm_stack_dumps`) — has every rank dump its
Python stacks into the run's hang folder before a hung group is stopped (and on the watchdog's
request).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray import cloudpickle

from stratarl.observe.stack_dumps import BUSY, ArmedProcess, dump_armed
from stratarl.transport.data_proto import DataProto

Call = tuple[tuple, dict]  # (args, kwargs) for one rank
WAIT_POLL_S = 1.0


class WorkerError(RuntimeError):
    """Ranks of a role failed in a phase: `reasons` maps each failed rank to what happened."""

    def __init__(self, role: str, phase: str, reasons: Mapping[int, str]):
        self.role, self.phase, self.reasons = role, phase, dict(sorted(reasons.items()))
        details = "; ".join(f"rank {rank} {why}" for rank, why in self.reasons.items())
        super().__init__(f"{role} worker group failed in phase {phase!r}: {details}")

    @property
    def ranks(self) -> list[int]:
        return list(self.reasons)


def wire_bytes(obj: Any) -> int:
    """The serialized size of `obj` (pickle protocol 5; large buffers are measured, not copied)."""
    buffers: list[int] = []
    head = cloudpickle.dumps(obj, protocol=5, buffer_callback=lambda b: buffers.append(b.raw().nbytes))
    return len(head) + sum(buffers)


@dataclass
class ControllerTraffic:
    """Bytes the controller sent to and received from ranks since the last `take`."""

    sent: int = 0
    received: int = 0

    def take(self) -> dict[str, float]:
        out = {"controller/sent_bytes": float(self.sent), "controller/received_bytes": float(self.received)}
        self.sent = self.received = 0
        return out


class InProcessRanks:
    """Ranks that are objects in this process, called one after the other (no collectives between
    them: one rank, or independent replicas). Nothing crosses a process, so no bytes are counted."""

    def __init__(self, role: str, workers: Sequence[Any]):
        if not workers:
            raise ValueError(f"{role}: a worker group needs at least one rank")
        self.role, self.workers = role, list(workers)
        self.traffic = ControllerTraffic()

    @property
    def size(self) -> int:
        return len(self.workers)

    def call(self, phase: str, method: str, per_rank: Sequence[Call]) -> list[Any]:
        _check_arity(self.role, self.size, per_rank)
        results = []
        for rank, (worker, (args, kwargs)) in enumerate(zip(self.workers, per_rank, strict=True)):
            try:
                results.append(getattr(worker, method)(*args, **kwargs))
            except Exception as error:
                error.add_note(f"in {self.role} rank {rank}, phase {phase!r}")
                raise
        return results

    def call_all(self, phase: str, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return self.call(phase, method, [(args, kwargs)] * self.size)

    def arm_stack_dumps(self, folder: str | Path) -> list[str]:
        """Nothing to arm: the ranks are this process, whose stacks the watchdog dumps itself."""
        return []

    def dump_stacks(self, folder: str | Path, header: str) -> list[str]:
        return []

    def stop(self) -> None:
        """Nothing to stop: the objects live as long as this process holds them."""


class RayRanks:
    """Ranks that are Ray actors (rank i = actors[i]).

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
        self.last_calls: dict[int, dict[str, Any]] = {}  # rank -> the last call it received
        self.armed: list[ArmedProcess] = []  # ranks whose stacks can be dumped (arm_stack_dumps)
        self.hang_dir: Path | None = None

    @property
    def size(self) -> int:
        return len(self.actors)

    def call(self, phase: str, method: str, per_rank: Sequence[Call]) -> list[Any]:
        _check_arity(self.role, self.size, per_rank)
        if self.stopped is not None:
            raise WorkerError(
                self.role, phase, dict.fromkeys(range(self.size), f"not called: {self.stopped}")
            )
        self.traffic.sent += sum(wire_bytes(call) for call in per_rank)
        for rank, (args, _) in enumerate(per_rank):
            record_call(self.last_calls, rank, phase, method, args)
        refs = [
            getattr(actor, method).remote(*args, **kwargs)
            for actor, (args, kwargs) in zip(self.actors, per_rank, strict=True)
        ]
        results = self._wait(phase, refs)
        self.traffic.received += sum(wire_bytes(result) for result in results)
        return results

    def call_all(self, phase: str, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """One-to-all: the same arguments to every rank (init, save, load, weight sync)."""
        return self.call(phase, method, [(args, kwargs)] * self.size)

    def call_rank(self, rank: int, phase: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """One rank only (e.g. rank 0 choosing where the group meets)."""
        return self._wait(phase, [getattr(self.actors[rank], method).remote(*args, **kwargs)], [rank])[0]

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
        armed = self.call_all("watchdog", "register_stack_dump", str(self.hang_dir / "ranks"), self.role)
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
        """Kill every rank's process; later calls raise at once."""
        if self.stopped is None:
            self.stopped = reason
        for actor in self.actors:
            ray.kill(actor, no_restart=True)


def _check_arity(role: str, size: int, per_rank: Sequence[Call]) -> None:
    if len(per_rank) != size:
        raise ValueError(f"{role}: {len(per_rank)} calls for {size} ranks")


def error_summary(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else type(error).__name__


def _pid(worker: Any) -> int:
    return os.getpid()


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
