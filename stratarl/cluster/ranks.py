"""Layer 3, orchestration: the ranks of a role, and how one call reaches them — the in-process backend.

A worker group (`worker_group`, `critic_group`) decides what each rank receives; a ranks backend
delivers it: `call(phase, method, per_rank)` runs `method(worker, *args, **kwargs)` on every rank's
worker with that rank's arguments and returns the results in rank order. `method` is the worker
class's own function (e.g. `PolicyWorker.compute_log_prob`), not its name, so a call that names a
method the worker lacks fails where it is written. `InProcessRanks` calls workers in this process;
`ray_ranks.RayRanks` calls the same workers held by Ray actors and turns a rank that died, raised or
hung into one `WorkerError` naming the role, the ranks and the phase.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

Call = tuple[tuple, dict]  # (args, kwargs) for one rank
Method = Callable[..., Any]  # a worker class's function, called as method(worker, *args, **kwargs)


class WorkerError(RuntimeError):
    """Ranks of a role failed in a phase: `reasons` maps each failed rank to what happened."""

    def __init__(self, role: str, phase: str, reasons: Mapping[int, str]):
        self.role, self.phase, self.reasons = role, phase, dict(sorted(reasons.items()))
        details = "; ".join(f"rank {rank} {why}" for rank, why in self.reasons.items())
        super().__init__(f"{role} worker group failed in phase {phase!r}: {details}")

    @property
    def ranks(self) -> list[int]:
        return list(self.reasons)


@dataclass
class ControllerTraffic:
    """Bytes the controller sent to and received from ranks since the last `take`."""

    sent: int = 0
    received: int = 0

    def take(self) -> dict[str, float]:
        out = {"controller/sent_bytes": float(self.sent), "controller/received_bytes": float(self.received)}
        self.sent = self.received = 0
        return out


class Ranks(Protocol):
    """What a worker group needs of its ranks (`InProcessRanks`, `ray_ranks.RayRanks`)."""

    role: str
    traffic: ControllerTraffic

    @property
    def size(self) -> int: ...

    def call(self, phase: str, method: Method, per_rank: Sequence[Call]) -> list[Any]: ...

    def call_all(self, phase: str, method: Method, *args: Any, **kwargs: Any) -> list[Any]: ...

    def arm_stack_dumps(self, folder: str | Path) -> list[str]: ...

    def dump_stacks(self, folder: str | Path, header: str) -> list[str]: ...

    def stop(self) -> None: ...


class InProcessRanks:
    """Ranks whose workers are objects in this process, called one after the other (no collectives
    between them: one rank, or independent replicas). Nothing crosses a process: no bytes counted."""

    def __init__(self, role: str, workers: Sequence[Any]):
        if not workers:
            raise ValueError(f"{role}: a worker group needs at least one rank")
        self.role, self.workers = role, list(workers)
        self.traffic = ControllerTraffic()

    @property
    def size(self) -> int:
        return len(self.workers)

    def call(self, phase: str, method: Method, per_rank: Sequence[Call]) -> list[Any]:
        check_arity(self.role, self.size, per_rank)
        results = []
        for rank, (worker, (args, kwargs)) in enumerate(zip(self.workers, per_rank, strict=True)):
            try:
                results.append(method(worker, *args, **kwargs))
            except Exception as error:
                error.add_note(f"in {self.role} rank {rank}, phase {phase!r}")
                raise
        return results

    def call_all(self, phase: str, method: Method, *args: Any, **kwargs: Any) -> list[Any]:
        """One-to-all: the same arguments to every rank (save, load, weight sync)."""
        return self.call(phase, method, [(args, kwargs)] * self.size)

    def arm_stack_dumps(self, folder: str | Path) -> list[str]:
        """Nothing to arm: the ranks are this process, whose stacks the watchdog dumps itself."""
        return []

    def dump_stacks(self, folder: str | Path, header: str) -> list[str]:
        return []

    def stop(self) -> None:
        """Nothing to stop: the objects live as long as this process holds them."""


def check_arity(role: str, size: int, per_rank: Sequence[Call]) -> None:
    if len(per_rank) != size:
        raise ValueError(f"{role}: {len(per_rank)} calls for {size} ranks")
