"""Layer 3, orchestration: the reward model on Ray — one rank process on the plan's reward_model pool.

The reward model starts by the path every role takes: the placement plan has a pool `reward_model`
of one bundle (reward.model.cpus / reward.model.gpus; `placement.reward_model_pool`), validated
and reserved as a placement group with the other pools before any process starts
(`start_policy_group`); one `RankProcess` on that bundle builds the in-process constructor,
`RewardModelWorker(spec)`, with no process group (the model is not sharded), its torch threads
from its CPU share unless cluster.threads_per_worker, its CUDA device the GPU Ray assigned it.
Every call goes through `RayRanks`, so a reward model that raises, dies or outlives
cluster.call_timeout_s is a `WorkerError` naming role `reward_model` and the phase (`init` while
it loads, `reward_model.score` after), and the watchdog dumps its stacks like a rank's
(`arm_stack_dumps`, `dump_stacks`).

`start_reward_model_beside(policy, spec)` uses the pool the policy group reserved and records the
process's node in that group's deployment, which is what placement.json lists;
`start_reward_model(spec, plan)` reserves the pool itself (a reward model without a policy: tests).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from torch import Tensor

from stratarl.cluster.placement import (
    PlacementError,
    PlacementPlan,
    PlacementProblem,
    ResourcePool,
    validate_plan,
)
from stratarl.cluster.rank_process import RankProcess, start_processes
from stratarl.cluster.ray_cluster import (
    RayDeployment,
    cluster_capacity,
    reserve_pools,
    start_or_join,
)
from stratarl.cluster.ray_ranks import RayRanks
from stratarl.cluster.reward_worker import RewardModelSpec, RewardModelWorker

ROLE = "reward_model"
SCORE_PHASE = "reward_model.score"


class RayRewardModel:
    """The reward model's rank process (`RayRanks` of one), called like a `RewardModelWorker`.
    `deployment`: the pool and connection this handle reserved itself (None beside a policy,
    whose shutdown releases them)."""

    def __init__(self, ranks: RayRanks, deployment: RayDeployment | None = None) -> None:
        self.ranks, self.deployment = ranks, deployment

    def score_conversations(self, conversations: Sequence[list[dict[str, Any]]]) -> Tensor:
        """[N] float32 scores, from `RewardModelWorker.score_conversations` on the rank."""
        (scores,) = self.ranks.call_all(
            SCORE_PHASE, RewardModelWorker.score_conversations, list(conversations)
        )
        return scores

    def placement(self) -> dict[str, list[str]]:
        """{"reward_model": [the Ray node id of its process]}."""
        return {ROLE: list(self.ranks.nodes)}

    def arm_stack_dumps(self, folder: str | Path) -> list[str]:
        """Have the process dump its stacks on request from now on (`RayRanks.arm_stack_dumps`)."""
        return self.ranks.arm_stack_dumps(folder)

    def dump_stacks(self, folder: str | Path, header: str) -> list[str]:
        return self.ranks.dump_stacks(folder, header)

    def close(self) -> None:
        """Stop the process, then release what this handle reserved itself."""
        self.ranks.stop("closed")
        if self.deployment is not None:
            self.deployment.stop()


def start_reward_model_beside(policy: Any, spec: RewardModelSpec) -> RayRewardModel:
    """The reward model's process on the `reward_model` pool that `policy` (a worker group from
    `start_policy_group`) reserved with its plan, with its call timeout and threads; its node joins
    the policy's deployment, so `policy.placement()` (placement.json) lists it."""
    placed = getattr(policy, "deployment", None)
    if not isinstance(placed, RayDeployment):
        raise TypeError("the reward model's Ray process goes beside a policy group started on Ray")
    ranks = _start(spec, placed)
    placed.nodes[ROLE] = ranks.nodes
    return RayRewardModel(ranks)


def start_reward_model(
    spec: RewardModelSpec,
    plan: PlacementPlan,
    *,
    address: str | None = None,
    num_cpus: int | None = None,
    call_timeout_s: float = 600.0,
    threads_per_worker: int | None = None,
) -> RayRewardModel:
    """The reward model's process on the `reward_model` pool of `plan`, reserved here (no policy
    group); the cluster is joined or started like the policy's."""
    pool = pool_of_reward_model(plan)
    session = start_or_join(address, num_cpus=num_cpus)
    own = PlacementPlan(plan.name, (pool,), {ROLE: pool.name})
    try:
        cpus, gpus = cluster_capacity()
        validate_plan(own, roles=[ROLE], cluster_cpus=cpus, cluster_gpus=gpus)
        pools = reserve_pools(own, timeout_s=call_timeout_s)
    except BaseException:
        session.shutdown()
        raise
    deployment = RayDeployment(session, own, pools, call_timeout_s, threads_per_worker)
    try:
        ranks = _start(spec, deployment)
    except BaseException:
        deployment.stop()
        raise
    deployment.nodes[ROLE] = ranks.nodes
    return RayRewardModel(ranks, deployment)


def _start(spec: RewardModelSpec, deployment: RayDeployment) -> RayRanks:
    """One `RankProcess` on the pool's bundle, its worker built there; a load that fails is a
    `WorkerError` in phase `init`, before training starts (the process is stopped)."""
    pool = pool_of_reward_model(deployment.plan)
    actors = start_processes(
        pool,
        deployment.placement_groups[pool.name],
        lambda rank: partial(RewardModelWorker, spec),
        threads=deployment.threads,
        timeout_s=deployment.timeout_s,
    )
    ranks = RayRanks(ROLE, actors, timeout_s=deployment.timeout_s)
    ranks.call_processes("init", RankProcess.start)
    ranks.nodes = ranks.call_processes("init", RankProcess.node_id)
    return ranks


def pool_of_reward_model(plan: PlacementPlan) -> ResourcePool:
    """The pool `plan` places the reward model on, or `PlacementError` naming the keys."""
    if ROLE not in plan.roles:
        problem = (
            f"the {plan.name!r} plan places no reward model (make the plan with {ROLE!r} among its roles)"
        )
        raise PlacementError([PlacementProblem(("cluster.placement", "reward.model.enable"), problem)])
    return plan.pool_of(ROLE)
