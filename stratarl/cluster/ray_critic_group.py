"""Layer 3, orchestration: the critic's worker group on Ray — its ranks beside the actor's, in turns.

Placement (verl colocates the critic with the actor in one resource pool): the plan places the
critic on the actor's training pool, and a pool hosting the critic has two processes per bundle
(`placement.processes_for`): the policy's rank and the critic's rank r both sit on bundle r of the
same placement group, each asking Ray for half of it, so they share its node and its GPU; each
uses all of the bundle's threads, because the phases of a step run one after the other (values,
critic update, then the actor's). Both halves are reserved with the plan before any process
starts, so an impossible critic placement fails there, naming the config keys (`validate_plan`).

Start-up: `beside(policy, spec)` uses the pools and the TransferQueue the policy group reserved;
without a policy group (tests, a critic alone) the group connects and reserves its own pool.
Then one `CriticRank` per bundle, rank 0 chooses where the critic's own process group meets, and
every rank joins it and builds its FSDP2-sharded value model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import ray
from ray.util.placement_group import PlacementGroup

from stratarl.cluster.critic_group import CriticWorkerGroup
from stratarl.cluster.critic_rank import CriticRank, CriticSpec
from stratarl.cluster.placement import (
    PlacementError,
    PlacementPlan,
    PlacementProblem,
    processes_for,
    validate_plan,
)
from stratarl.cluster.queue_rows import QueueRows
from stratarl.cluster.rank_process import start_ranks
from stratarl.cluster.ranks import RayRanks
from stratarl.cluster.ray_cluster import (
    RaySession,
    cluster_capacity,
    release_pools,
    reserve_pools,
    start_or_join,
)

if TYPE_CHECKING:
    from stratarl.cluster.ray_policy_group import RayPolicyGroup


class RayCriticGroup(CriticWorkerGroup):
    """`CriticWorkerGroup` whose ranks are `CriticRank` Ray actors on the critic's pool of `plan`.

    placement_groups: the plan's reserved pools (the policy group's); None reserves the critic's
    pool here (and frees it at shutdown). queue_rows: the policy's TransferQueue rows, or None.
    address, num_cpus: the Ray cluster to join or start when none is connected. call_timeout_s,
    threads_per_worker, backend: as for `RayPolicyGroup`.
    """

    def __init__(
        self,
        spec: CriticSpec,
        plan: PlacementPlan,
        *,
        placement_groups: dict[str, PlacementGroup] | None = None,
        queue_rows: QueueRows | None = None,
        address: str | None = None,
        num_cpus: int | None = None,
        call_timeout_s: float = 600.0,
        threads_per_worker: int | None = None,
        backend: str = "gloo",
        linear_coeff: float = 0.0,
    ):
        check_critic_placement(plan)
        self.session: RaySession = start_or_join(address, num_cpus=num_cpus)
        self.pool = plan.pool_of("critic")
        self.reserved: dict[str, PlacementGroup] = {}
        if placement_groups is None:
            own = PlacementPlan(plan.name, (self.pool,), {"critic": self.pool.name})
            cpus, gpus = cluster_capacity()
            validate_plan(own, roles=["critic"], cluster_cpus=cpus, cluster_gpus=gpus)
            placement_groups = self.reserved = reserve_pools(own, timeout_s=call_timeout_s)
        self.spec, self.timeout_s, self.threads = spec, call_timeout_s, threads_per_worker
        try:
            ranks = self._start_ranks(placement_groups[self.pool.name], backend=backend)
        except Exception:
            release_pools(self.reserved)
            raise
        super().__init__(ranks, linear_coeff=linear_coeff, queue_rows=queue_rows)

    @classmethod
    def beside(cls, policy: RayPolicyGroup, spec: CriticSpec, *, backend: str = "gloo") -> RayCriticGroup:
        """The critic's ranks on the pools the policy group reserved (the other half of each training
        bundle), reading the rows of the policy's TransferQueue, with its timeout and threads."""
        return cls(
            spec,
            policy.plan,
            placement_groups=policy.placement_groups,
            queue_rows=policy.rows,
            call_timeout_s=policy.timeout_s,
            threads_per_worker=policy.threads,
            backend=backend,
        )

    def _start_ranks(self, group: PlacementGroup, *, backend: str) -> RayRanks:
        # threads: the whole bundle's, since the critic's and the policy's processes take turns
        return start_ranks(
            "critic",
            CriticRank,
            self.pool,
            group,
            threads=self.threads,
            timeout_s=self.timeout_s,
            spec=self.spec,
            backend=backend,
        )

    def shutdown(self) -> None:
        """Stop the critic's ranks, free a pool this group reserved, end a cluster it started. After
        the policy group's shutdown (which ends Ray), there is nothing left to stop."""
        if ray.is_initialized():
            super().shutdown()
            release_pools(self.reserved)
        self.session.shutdown()


def check_critic_placement(plan: PlacementPlan) -> None:
    """Raise `PlacementError` unless `plan` places the critic on a pool whose bundles have room for
    the critic's process (the plan was made with the critic among its roles)."""
    if "critic" not in plan.roles:
        problem = f"the {plan.name!r} plan places no critic (make the plan with 'critic' among its roles)"
        raise PlacementError([PlacementProblem(("cluster.placement", "critic.enable"), problem)])
    pool = plan.pool_of("critic")
    needed = processes_for(plan.roles_on(pool.name))
    if pool.processes_per_bundle != needed:
        problem = (
            f"pool {pool.name!r} hosts {plan.roles_on(pool.name)}, which need {needed} processes per "
            f"bundle, but its bundles are shared by {pool.processes_per_bundle}"
        )
        raise PlacementError([PlacementProblem(("cluster.placement", "critic.enable"), problem)])
