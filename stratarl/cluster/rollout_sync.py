"""Layer 3, orchestration: how a policy group's actor reaches its rollout engines — colocated or split.

A `PolicyWorkerGroup` holds one `RolloutSync`, chosen from the placement plan when it is built:

- `ColocatedSync`: the engines are the ranks' own (the in-process worker's, or the colocated plan's).
  A weight sync is one collective on the ranks: rank 0 gathers the full weights (or LoRA's base and
  adapter) and hands them to the other ranks, and every rank loads its own engine
  (`PolicyWorker.sync_weights`). The engines are no processes beyond the ranks.
- `SplitSync`: the engines are replicas in a pool of their own (the split plan). The ranks gather the
  weights together and rank 0 pushes them to every replica in buckets, checked by version and
  checksum (`PolicyWorker.push_weights`), never through the controller. The replicas are processes
  of their own, so the watchdog arms and dumps their stacks too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from stratarl.cluster.policy_worker import PolicyWorker
from stratarl.cluster.ranks import Ranks
from stratarl.cluster.rollout_set import RolloutReplicas
from stratarl.rollout.weight_sync import DEFAULT_BUCKET_BYTES, WeightLoadReport


class RolloutSync(Protocol):
    """The weight sync and the rollout's own processes (none, or the replicas) of one placement."""

    def sync(self, ranks: Ranks, engines: RolloutReplicas, version: int | None) -> list[WeightLoadReport]:
        """Actor -> every engine as `version` (None: the served version + 1); one report per engine."""
        ...

    def arm_stack_dumps(self, engines: RolloutReplicas, folder: str | Path) -> list[str]: ...

    def dump_stacks(self, engines: RolloutReplicas, folder: str | Path, header: str) -> list[str]: ...


@dataclass(frozen=True)
class ColocatedSync:
    """Every rank loads its own engine; the engines live in the ranks' processes."""

    def sync(self, ranks: Ranks, engines: RolloutReplicas, version: int | None) -> list[WeightLoadReport]:
        return ranks.call_all("weight_sync", PolicyWorker.sync_weights, version)

    def arm_stack_dumps(self, engines: RolloutReplicas, folder: str | Path) -> list[str]:
        """Nothing beyond the ranks to arm: the ranks' dumps show their engines."""
        return []

    def dump_stacks(self, engines: RolloutReplicas, folder: str | Path, header: str) -> list[str]:
        return []


@dataclass(frozen=True)
class SplitSync:
    """Rank 0 pushes to the replicas of a rollout pool, in buckets of at most `bucket_bytes`."""

    bucket_bytes: int = DEFAULT_BUCKET_BYTES

    def sync(self, ranks: Ranks, engines: RolloutReplicas, version: int | None) -> list[WeightLoadReport]:
        """Every rank joins the gather; rank 0 sent, so its list has one report per replica. The
        replicas are asked their version first: one lost since its last call is started again
        (rollout.max_replica_restarts) before rank 0 sends to it."""
        served = engines.weight_version
        version = served + 1 if version is None else version
        pushed = ranks.call_all(
            "weight_sync",
            PolicyWorker.push_weights,
            engines.targets,
            version=version,
            bucket_bytes=self.bucket_bytes,
        )
        return pushed[0]

    def arm_stack_dumps(self, engines: RolloutReplicas, folder: str | Path) -> list[str]:
        """The replicas are processes of their own: they dump their stacks on request from now on."""
        return engines.arm_stack_dumps(folder)

    def dump_stacks(self, engines: RolloutReplicas, folder: str | Path, header: str) -> list[str]:
        return engines.dump_stacks(folder, header)
