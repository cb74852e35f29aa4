"""Layer 3, orchestration: the critic's worker group on Ray — its ranks beside the actor's, in turns.

Placement (verl colocates the critic with the actor in one resource pool): the plan places the
critic on the actor's training pool, and a pool hosting the critic has two processes per bundle
(`placement.processes_for`): the policy's rank and the critic's rank r both sit on bundle r of the
same placement group, each asking Ray for half of it, so they share its node and its GPU; each
uses all of the bundle's threads, because the phases of a step run one after the other (values,
critic update, then the actor's). Both halves are reserved with the plan before any process
starts, so an impossible critic placement fails there, naming the config keys (`validate_plan`).

Start-up: `start_critic_beside(policy, spec)` uses the pools and the TransferQueue the policy group
reserved; without a policy group (tests, a critic alone) `start_critic_group` connects and
reserves its own pool. Then one `RankProcess` per bundle, rank 0 chooses where the critic's own
process group meets, and every rank joins it and builds its `CriticWorker` (the in-process
constructor), the value model FSDP2-sharded over that group.
"""

from __future__ import annotations

from functools import partial

from ray.util.placement_group import PlacementGroup

from stratarl.cluster.critic_group import CriticWorkerGroup
from stratarl.cluster.critic_worker import CriticWorker
from stratarl.cluster.dispatch import DirectDispatch, RowPath
from stratarl.cluster.placement import (
    PlacementError,
    PlacementPlan,
    PlacementProblem,
    processes_for,
    validate_plan,
)
from stratarl.cluster.rank_process import start_ranks
from stratarl.cluster.ray_cluster import (
    RayDeployment,
    RaySession,
    cluster_capacity,
    reserve_pools,
    start_or_join,
)
from stratarl.cluster.specs import CriticSpec
from stratarl.cluster.worker_group import PolicyWorkerGroup


def start_critic_group(
    spec: CriticSpec,
    plan: PlacementPlan,
    *,
    address: str | None = None,
    num_cpus: int | None = None,
    call_timeout_s: float = 600.0,
    threads_per_worker: int | None = None,
    backend: str = "gloo",
    linear_coeff: float = 0.0,
) -> CriticWorkerGroup:
    """The critic's ranks on the critic's pool of `plan`, reserved here (a critic without a policy
    group: tests); the cluster is joined or started like the policy's."""
    check_critic_placement(plan)
    session = start_or_join(address, num_cpus=num_cpus)
    pool = plan.pool_of("critic")
    own = PlacementPlan(plan.name, (pool,), {"critic": pool.name})
    try:
        cpus, gpus = cluster_capacity()
        validate_plan(own, roles=["critic"], cluster_cpus=cpus, cluster_gpus=gpus)
        pools = reserve_pools(own, timeout_s=call_timeout_s)
    except BaseException:
        session.shutdown()
        raise
    deployment = RayDeployment(session, own, pools, call_timeout_s, threads_per_worker)
    return _start(spec, deployment, DirectDispatch(linear_coeff), backend=backend)


def start_critic_beside(
    policy: PolicyWorkerGroup, spec: CriticSpec, *, backend: str = "gloo"
) -> CriticWorkerGroup:
    """The critic's ranks on the pools the policy group reserved (the other half of each training
    bundle), its rows on the policy group's path (its TransferQueue, if any), with its timeout and
    threads."""
    placed: RayDeployment | None = policy.deployment  # type: ignore[assignment]
    if not isinstance(placed, RayDeployment):
        raise TypeError("the critic's Ray ranks go beside a policy group started on Ray (start_policy_group)")
    check_critic_placement(placed.plan)
    beside = RayDeployment(
        RaySession(started=False),
        placed.plan,
        placed.placement_groups,
        placed.timeout_s,
        placed.threads,
        owns_pools=False,
    )
    return _start(spec, beside, policy.path, backend=backend)


def _start(spec: CriticSpec, deployment: RayDeployment, path: RowPath, *, backend: str) -> CriticWorkerGroup:
    pool = deployment.plan.pool_of("critic")
    group: PlacementGroup = deployment.placement_groups[pool.name]
    try:
        # threads: the whole bundle's, since the critic's and the policy's processes take turns
        ranks = start_ranks(
            "critic",
            partial(CriticWorker, spec),
            pool,
            group,
            threads=deployment.threads,
            timeout_s=deployment.timeout_s,
            backend=backend,
        )
    except BaseException:
        deployment.stop()
        raise
    deployment.nodes["critic"] = ranks.nodes
    return CriticWorkerGroup(ranks, path=path, deployment=deployment)


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
