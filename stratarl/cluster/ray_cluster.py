"""Layer 3, orchestration: the Ray cluster a run uses, and the placement groups that back its pools.

With no address, a private local cluster: `address="local"` (never another session's cluster
found through RAY_ADDRESS or the default temp dir), no dashboard, a temp dir of its own (Ray's
socket paths must stay under 108 characters, so it lives in /tmp). With an address, the run
joins that cluster (`ray start --head` on one node, `ray start --address=…` on the others).
Each pool becomes one placement group; a pool that cannot be reserved in time is an error
naming its config keys, not a silent wait.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from stratarl.cluster.placement import PlacementError, PlacementPlan, PlacementProblem, ResourcePool


@dataclass
class RaySession:
    """The connection this run made; `shutdown` ends it (and the local cluster it started)."""

    started: bool
    temp_dir: str | None = None

    def shutdown(self) -> None:
        if self.started:
            ray.shutdown()
            if self.temp_dir is not None:
                shutil.rmtree(self.temp_dir, ignore_errors=True)


@dataclass
class RayDeployment:
    """What a worker group on Ray was started with, released by `stop` (once, in this order): the
    actors of its own beside the ranks (rollout replicas, TransferQueue storage units), the pools it
    reserved, then the cluster connection it made. A group started beside another (a critic beside
    the policy) reuses that one's pools and connection and releases neither.

    plan, placement_groups: the pools (each reserved as one placement group). timeout_s, threads:
    the call timeout and torch threads its processes were started with, for groups started beside it.
    nodes: role -> the Ray node id of each of its processes (rank or replica order).
    """

    session: RaySession
    plan: PlacementPlan
    placement_groups: dict[str, PlacementGroup]
    timeout_s: float
    threads: int | None = None
    actors: list[Any] = field(default_factory=list)
    storage: Any = None  # RayStorageUnits of the TransferQueue, or None
    owns_pools: bool = True
    stopped: bool = False
    nodes: dict[str, list[str]] = field(default_factory=dict)

    def stop(self) -> None:
        if self.stopped or not ray.is_initialized():  # a cluster already ended holds nothing left
            self.stopped = True
            self.session.shutdown()
            return
        self.stopped = True
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        if self.storage is not None:
            self.storage.shutdown()
        if self.owns_pools:
            release_pools(self.placement_groups)
        self.session.shutdown()


def start_or_join(
    address: str | None = None, *, num_cpus: int | None = None, num_gpus: int | None = None
) -> RaySession:
    """Use the Ray connection this process already has, else join `address`, else start a local
    cluster with `num_cpus` / `num_gpus` (None: what the machine has)."""
    if ray.is_initialized():
        return RaySession(started=False)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # closed networks: no phone-home
    if address is not None:
        ray.init(address=address, log_to_driver=True)
        return RaySession(started=True)
    temp_dir = tempfile.mkdtemp(prefix="srl-ray-", dir="/tmp")
    ray.init(
        address="local",
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        include_dashboard=False,
        _temp_dir=temp_dir,
    )
    return RaySession(started=True, temp_dir=temp_dir)


def cluster_capacity() -> tuple[float, float]:
    """(CPUs, GPUs) of the whole cluster."""
    resources = ray.cluster_resources()
    return float(resources.get("CPU", 0.0)), float(resources.get("GPU", 0.0))


def reserve_pools(plan: PlacementPlan, *, timeout_s: float) -> dict[str, PlacementGroup]:
    """One ready placement group per pool of `plan`; on failure nothing stays reserved."""
    reserved: dict[str, PlacementGroup] = {}
    for pool in plan.pools:
        group = placement_group([b.as_ray() for b in pool.bundles], strategy=pool.strategy)
        reserved[pool.name] = group
        ready, _ = ray.wait([group.ready()], timeout=timeout_s)
        if not ready:
            for held in reserved.values():
                remove_placement_group(held)
            free = ray.available_resources()
            raise PlacementError(
                [
                    PlacementProblem(
                        pool.keys or ("cluster.placement",),
                        f"pool {pool.name!r} ({pool.world_size} × {pool.bundles[0].as_ray()}) could not be "
                        f"reserved within {timeout_s:g} s; free now: CPU {free.get('CPU', 0):g}, "
                        f"GPU {free.get('GPU', 0):g}",
                    )
                ]
            )
    return reserved


def release_pools(groups: dict[str, PlacementGroup]) -> None:
    for group in groups.values():
        remove_placement_group(group)


def actor_options(pool: ResourcePool, group: PlacementGroup, index: int) -> dict[str, Any]:
    """Ray actor options that put a process on bundle `index` of `pool`, asking for its share of
    that bundle (all of it, unless a critic's process shares the bundle: `ResourcePool.process_share`)."""
    share = pool.process_share(index)
    return {
        "num_cpus": share.cpus,
        "num_gpus": share.gpus,
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=index
        ),
    }
