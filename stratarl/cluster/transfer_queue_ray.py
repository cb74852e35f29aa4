"""Layer 3, orchestration: the TransferQueue's storage units as Ray actors.

Each actor wraps a `stratarl.transport.storage.StorageUnit` (numpy only: a unit process never
imports torch). Columns travel as numpy arrays, which Ray moves through its object store as raw
buffers: a reader gets a zero-copy view, where a torch tensor would be pickled and copied (cpu
feasibility notes: 100 MB numpy `ray.put` 0.009 s, torch 0.185 s). `RayStorageUnits` is a list
of actor handles, so it pickles cheaply: hand it (or the `TransferQueue` built on it) to every
worker, and each reads and writes the units directly while the driver holds only `KVBatchMeta`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ray

from stratarl.cluster.ranks import ControllerTraffic
from stratarl.cluster.ray_ranks import wire_bytes
from stratarl.transport.storage import StorageUnit
from stratarl.transport.transfer_queue import TransferQueue

_StorageUnitActor = ray.remote(StorageUnit)


class RayStorageUnits:
    """`StorageUnits` whose units are Ray actors; calls to different units run concurrently."""

    def __init__(self, actors: Sequence[Any]):
        if not actors:
            raise ValueError("RayStorageUnits needs at least one storage unit actor")
        self.actors = list(actors)
        # Bytes this process sent to and read from the units. Counted in the process that created
        # the handle (the controller); a copy pickled to a worker does not count.
        self.traffic: ControllerTraffic | None = ControllerTraffic()

    def __getstate__(self) -> dict[str, Any]:
        return {"actors": self.actors}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.actors, self.traffic = state["actors"], None

    @classmethod
    def create(
        cls, num_units: int, *, num_cpus: float = 0.0, name_prefix: str | None = None
    ) -> RayStorageUnits:
        """Start `num_units` storage-unit actors. They hold memory, not compute: num_cpus=0 by default
        so they never take a core from the workers (a placement group can pin them to nodes)."""
        if num_units < 1:
            raise ValueError(f"need at least one storage unit, got {num_units}")
        actors = []
        for i in range(num_units):
            options: dict[str, Any] = {"num_cpus": num_cpus}
            if name_prefix is not None:
                options["name"] = f"{name_prefix}-{i}"
            actors.append(_StorageUnitActor.options(**options).remote())
        return cls(actors)

    def __len__(self) -> int:
        return len(self.actors)

    def submit(self, unit: int, method: str, *args: Any) -> ray.ObjectRef:
        if self.traffic is not None:
            self.traffic.sent += wire_bytes(args)
        return getattr(self.actors[unit], method).remote(*args)

    def collect(self, pending: Sequence[ray.ObjectRef]) -> list[Any]:
        results = ray.get(list(pending))
        if self.traffic is not None:
            self.traffic.received += sum(wire_bytes(result) for result in results)
        return results

    def shutdown(self) -> None:
        """Kill the unit actors; every row they held is gone."""
        for actor in self.actors:
            ray.kill(actor)


def ray_transfer_queue(
    num_units: int = 2, *, num_cpus: float = 0.0, name_prefix: str | None = None
) -> TransferQueue:
    """A TransferQueue over `num_units` new storage-unit actors (ray.init must have run)."""
    return TransferQueue(RayStorageUnits.create(num_units, num_cpus=num_cpus, name_prefix=name_prefix))
