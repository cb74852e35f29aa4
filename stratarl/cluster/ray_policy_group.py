"""Layer 3, orchestration: the policy worker group on Ray — start-up in the order that keeps failures early.

1. connect: join `address`, or start a private local cluster;
2. validate the plan against the cluster's CPUs/GPUs and the batch sizes (no process started yet);
3. reserve one placement group per pool;
4. start the training ranks (one `PolicyRank` actor per bundle, threads from its CPU share), let
   rank 0 choose where the group meets, and have every rank join it and build its models;
5. in the split plan, start the rollout replicas on their own pool;
6. start the TransferQueue's storage units: from then on each phase's rows go from the engines
   and ranks that produce them to the ranks that read them, and the controller passes references.
Then it is a `PolicyWorkerGroup`: the trainer calls the same methods as on one `PolicyWorker`.
"""

from __future__ import annotations

from collections.abc import Mapping

import ray

from stratarl.cluster.placement import PlacementPlan, validate_plan
from stratarl.cluster.policy_rank import PolicyRank, PolicySpec
from stratarl.cluster.queue_rows import QueueRows
from stratarl.cluster.rank_process import start_ranks
from stratarl.cluster.ranks import RayRanks
from stratarl.cluster.ray_cluster import (
    RaySession,
    actor_options,
    cluster_capacity,
    release_pools,
    reserve_pools,
    start_or_join,
)
from stratarl.cluster.rollout_replica import RemoteReplica, RolloutReplica, RolloutReplicas
from stratarl.cluster.transfer_queue_ray import ray_transfer_queue
from stratarl.cluster.worker_group import PolicyWorkerGroup
from stratarl.rollout.weight_sync import DEFAULT_BUCKET_BYTES


class RayPolicyGroup(PolicyWorkerGroup):
    """`PolicyWorkerGroup` whose ranks (and, in a split plan, rollout replicas) are Ray actors.

    plan: pools and roles (`placement.make_plan`). address: a Ray cluster to join (None: start a
    local one with `num_cpus`). call_timeout_s: the longest any remote call may take before the
    ranks still busy count as hung. threads_per_worker: torch threads per process (None: from its
    CPU share). rows_per_rank_split: batch sizes that must divide over the training ranks, keyed by
    the config keys that set them (checked with the plan). backend: "gloo" (CPU) or "nccl" (GPU).
    queue_units: storage units of the TransferQueue the phases' rows pass through (0: none, the
    batches travel through the controller).
    """

    def __init__(
        self,
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
    ):
        self.session: RaySession = start_or_join(address, num_cpus=num_cpus)
        cpus, gpus = cluster_capacity()
        roles = ["actor", "rollout"] + (["reference"] if spec.with_reference else [])
        validate_plan(
            plan, roles=roles, cluster_cpus=cpus, cluster_gpus=gpus, rows_per_rank_split=rows_per_rank_split
        )
        self.plan, self.spec, self.timeout_s, self.threads = plan, spec, call_timeout_s, threads_per_worker
        self.placement_groups = reserve_pools(plan, timeout_s=call_timeout_s)
        colocated = plan.is_colocated("actor", "rollout")
        ranks = self._start_ranks(with_rollout=colocated, backend=backend)
        if colocated:
            engines = [  # their generate calls are the ranks' calls too (hang reports)
                RemoteReplica(
                    actor,
                    r,
                    timeout_s=call_timeout_s,
                    calls=ranks.last_calls,
                    on_failure=ranks.record_failure,
                )
                for r, actor in enumerate(ranks.actors)
            ]
        else:
            engines = self._start_replicas()
        rollout = RolloutReplicas(engines, pad_token_id=spec.pad_token_id)
        self.initial_version = rollout.weight_version  # waits until every engine has its model
        # Storage units hold memory, not compute (0 CPUs): the phases' rows live there.
        queue = ray_transfer_queue(queue_units) if queue_units > 0 else None
        super().__init__(
            ranks,
            rollout,
            separate_rollout=not colocated,
            bucket_bytes=bucket_bytes,
            linear_coeff=linear_coeff,
            queue_rows=QueueRows(queue, linear_coeff=linear_coeff) if queue is not None else None,
        )

    def _start_ranks(self, *, with_rollout: bool, backend: str) -> RayRanks:
        pool = self.plan.pool_of("actor")
        group = self.placement_groups[pool.name]
        return start_ranks(
            "actor",
            PolicyRank,
            pool,
            group,
            threads=self.threads,
            timeout_s=self.timeout_s,
            spec=self.spec,
            with_rollout=with_rollout,
            backend=backend,
        )

    def _start_replicas(self) -> list[RemoteReplica]:
        pool = self.plan.pool_of("rollout")
        group = self.placement_groups[pool.name]
        replica_actor = ray.remote(RolloutReplica)
        spec = self.spec
        actors = [
            replica_actor.options(**actor_options(pool, group, index)).remote(
                replica_id=index,
                threads=self.threads or bundle.threads,
                model_path=spec.model_path,
                eos_token_ids=spec.eos_token_ids,
                pad_token_id=spec.pad_token_id,
                dtype=spec.rollout_dtype,
                seed=spec.rollout_seed,
                max_num_seqs=spec.max_num_seqs,
            )
            for index, bundle in enumerate(pool.bundles)
        ]
        return [RemoteReplica(actor, index, timeout_s=self.timeout_s) for index, actor in enumerate(actors)]

    def shutdown(self) -> None:
        """Stop every actor, free the placement groups, end the local cluster if this run started it."""
        super().shutdown()
        if self.rows is not None:
            self.rows.queue.units.shutdown()
        release_pools(self.placement_groups)
        self.session.shutdown()
