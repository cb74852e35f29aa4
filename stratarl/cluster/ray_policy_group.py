"""Layer 3, orchestration: the policy's worker group on Ray — start-up in the order that keeps failures early.

1. connect: join `address`, or start a private local cluster;
2. validate the plan against the cluster's CPUs/GPUs and the batch sizes (no process started yet);
3. reserve one placement group per pool;
4. start the training ranks (one `RankProcess` per bundle, threads from its CPU share), let rank 0
   choose where the group meets, and have every rank join it and build its `PolicyWorker` — the
   in-process backend's own constructor, with its models sharded over the group;
5. in the split plan, start the rollout replicas on their own pool (`RolloutReplica`, the same
   rollout factory), each startable again on its bundle (rollout.max_replica_restarts,
   `replica_restart.ReplicaRestarter`);
6. start the TransferQueue's storage units: from then on each phase's rows go from the engines
   and ranks that produce them to the ranks that read them, and the controller passes references.
The result is a `PolicyWorkerGroup`, the handle the in-process backend returns too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from stratarl.cluster.dispatch import DirectDispatch
from stratarl.cluster.placement import PlacementPlan, validate_plan
from stratarl.cluster.policy_worker import PolicyWorker
from stratarl.cluster.queue_rows import QueueRows
from stratarl.cluster.rank_process import RankProcess, start_process, start_ranks
from stratarl.cluster.ray_cluster import (
    RayDeployment,
    cluster_capacity,
    reserve_pools,
    start_or_join,
)
from stratarl.cluster.ray_ranks import RayRanks
from stratarl.cluster.replica_restart import ReplicaRestarter
from stratarl.cluster.rollout_replica import RemoteReplica, RolloutReplica
from stratarl.cluster.rollout_set import RolloutReplicas
from stratarl.cluster.rollout_sync import ColocatedSync, SplitSync
from stratarl.cluster.specs import PolicySpec
from stratarl.cluster.transfer_queue_ray import ray_transfer_queue
from stratarl.cluster.worker_group import PolicyWorkerGroup
from stratarl.rollout.weight_sync import DEFAULT_BUCKET_BYTES

REPLICA_CALL_THREADS = 4  # partial_rollout=continue: generate calls, a weight push and probes at once


def start_policy_group(
    spec: PolicySpec,
    plan: PlacementPlan,
    *,
    address: str | None = None,
    num_cpus: int | None = None,
    call_timeout_s: float = 600.0,
    threads_per_worker: int | None = None,
    rows_per_rank_split: Mapping[tuple[str, ...], int] | None = None,
    backend: str = "gloo",
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    linear_coeff: float = 0.0,
    queue_units: int = 2,
    max_replica_restarts: int = 0,
) -> PolicyWorkerGroup:
    """A `PolicyWorkerGroup` whose ranks (and, in a split plan, rollout replicas) are Ray actors.

    plan: pools and roles (`placement.make_plan`). address: a Ray cluster to join (None: start a
    local one with `num_cpus`). call_timeout_s: the longest any remote call may take before the
    ranks still busy count as hung. threads_per_worker: torch threads per process (None: from its
    CPU share). rows_per_rank_split: batch sizes that must divide over the training ranks, keyed by
    the config keys that set them (checked with the plan). backend: "gloo" (CPU) or "nccl" (GPU).
    queue_units: storage units of the TransferQueue the phases' rows pass through (0: none, the
    batches travel through the controller). max_replica_restarts: split plan, how many times over the
    run a rollout replica that died or hung is started again (0: the loss stops the run).
    """
    session = start_or_join(address, num_cpus=num_cpus)
    try:
        cpus, gpus = cluster_capacity()
        roles = ["actor", "rollout"] + (["reference"] if spec.reference is not None else [])
        validate_plan(
            plan, roles=roles, cluster_cpus=cpus, cluster_gpus=gpus, rows_per_rank_split=rows_per_rank_split
        )
        pools = reserve_pools(plan, timeout_s=call_timeout_s)
    except BaseException:
        session.shutdown()
        raise
    deployment = RayDeployment(session, plan, pools, call_timeout_s, threads_per_worker)
    ranks = None
    try:
        colocated = plan.is_colocated("actor", "rollout")
        pool = plan.pool_of("actor")
        ranks = start_ranks(
            "actor",
            partial(PolicyWorker, spec, with_rollout=colocated),
            pool,
            pools[pool.name],
            threads=threads_per_worker,
            timeout_s=call_timeout_s,
            backend=backend,
        )
        deployment.nodes["actor"] = ranks.nodes
        launch = None if colocated else replica_launcher(spec, deployment)
        replicas = ranks.actors if colocated else start_replicas(launch, deployment)
        # Colocated, the ranks' generate calls are the ranks' calls too (one record, one hang report).
        shared = {"calls": ranks.last_calls, "on_failure": ranks.record_failure} if colocated else {}
        engines = [
            RemoteReplica(actor, r, timeout_s=call_timeout_s, **shared) for r, actor in enumerate(replicas)
        ]
        deployment.nodes.setdefault("rollout", ranks.nodes)  # colocated: the ranks serve it
        restarter = None  # without restarts a lost replica's error stops the run
        if launch is not None and max_replica_restarts > 0:
            served = lambda: rollout.served_version  # noqa: E731  the version of the last sync
            restarter = ReplicaRestarter(launch, deployment, ranks, served, bucket_bytes=bucket_bytes)
        rollout = RolloutReplicas(
            engines, pad_token_id=spec.pad_token_id, start_again=restarter, max_restarts=max_replica_restarts
        )
        rollout.weight_version  # noqa: B018  waits until every engine has its model
        # Storage units hold memory, not compute (0 CPUs): the phases' rows live there.
        queue = ray_transfer_queue(queue_units) if queue_units > 0 else None
        deployment.storage = queue.units if queue is not None else None
        path = DirectDispatch(linear_coeff) if queue is None else QueueRows(queue, linear_coeff=linear_coeff)
    except BaseException:
        if ranks is not None:
            ranks.stop()
        deployment.stop()
        raise
    return PolicyWorkerGroup(
        ranks,
        rollout,
        rollout_sync=ColocatedSync() if colocated else SplitSync(bucket_bytes),
        path=path,
        deployment=deployment,
    )


def replica_launcher(spec: PolicySpec, deployment: RayDeployment) -> Callable[[int], Any]:
    """launch(i) -> a `RolloutReplica` process on bundle i of the rollout pool (its engine not yet
    built), on the GPU its bundle reserves (cluster.gpus_per_rollout_replica), else on the CPU.
    Under partial_rollout=continue a replica serves calls on several threads, so that a weight push
    reaches the engine while a generate call is in flight (the engine serializes its steps)."""
    pool = deployment.plan.pool_of("rollout")
    device = "cuda" if pool.gpus > 0 else "cpu"
    spec = dataclasses.replace(spec, model=dataclasses.replace(spec.model, device=device))
    concurrency = REPLICA_CALL_THREADS if spec.rollout.partial_rollout == "continue" else 1

    def launch(index: int) -> Any:
        return start_process(
            pool,
            deployment.placement_groups[pool.name],
            index,
            partial(RolloutReplica, spec, replica_id=index),
            threads=deployment.threads,
            max_concurrency=concurrency,
            timeout_s=deployment.timeout_s,
        )

    return launch


def start_replicas(launch: Callable[[int], Any], deployment: RayDeployment) -> list:
    """One `RolloutReplica` process per bundle of the rollout pool (`launch`), each its engine built
    and ready."""
    actors = [launch(index) for index in range(deployment.plan.pool_of("rollout").world_size)]
    deployment.actors += actors
    replicas = RayRanks("rollout", actors, timeout_s=deployment.timeout_s)
    replicas.call_processes("init", RankProcess.start)
    deployment.nodes["rollout"] = replicas.call_processes("init", RankProcess.node_id)
    return actors
