"""Layer 3, orchestration: the distillation teacher on Ray — one rank process on the plan's teacher pool.

The teacher starts by the path every role takes: the placement plan has a pool `teacher` of one
bundle (distillation.cpus / distillation.gpus; `placement.teacher_pool`), validated and reserved as
a placement group with the other pools before any process starts (`start_policy_group`); one
`RankProcess` on that bundle builds the in-process constructor, `TeacherWorker(spec)`, with no
process group (the teachers are not sharded), its models on the GPU Ray assigned it when the
bundle has one, else on the CPU. Every call goes through `RayRanks`, so a teacher that raises,
dies or outlives cluster.call_timeout_s is a `WorkerError` naming role `teacher` and the phase
(`init` while it loads, `teacher.log_prob` after), and the watchdog dumps its stacks like a rank's.

It reads only the trajectories' tokens: the policy group's row path sends it the model inputs of
the rows (with the TransferQueue, a shard reference: the process reads the tokens from the queue
itself and writes the teacher's columns there, as the policy's ranks do with their log-probs).
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

from stratarl.cluster.placement import PlacementError, PlacementPlan, PlacementProblem, ResourcePool
from stratarl.cluster.rank_process import RankProcess, start_processes
from stratarl.cluster.ray_cluster import RayDeployment
from stratarl.cluster.ray_ranks import RayRanks
from stratarl.cluster.specs import TeacherSpec
from stratarl.cluster.teacher_worker import TeacherWorker

ROLE = "teacher"


def start_teacher_beside(policy: Any, spec: TeacherSpec) -> RayRanks:
    """The teacher's process on the `teacher` pool that `policy` (a worker group from
    `start_policy_group`) reserved with its plan; its node joins the policy's deployment, so
    `policy.placement()` (placement.json) lists it, and the policy group scores its teacher phase
    there from then on (`PolicyWorkerGroup.place_teacher`)."""
    placed = getattr(policy, "deployment", None)
    if not isinstance(placed, RayDeployment):
        raise TypeError("the teacher's Ray process goes beside a policy group started on Ray")
    pool = pool_of_teacher(placed.plan)
    device = "cuda" if pool.gpus > 0 else "cpu"
    teachers = {
        name: dataclasses.replace(t, model=dataclasses.replace(t.model, device=device))
        for name, t in spec.teachers.items()
    }
    actors = start_processes(
        pool,
        placed.placement_groups[pool.name],
        lambda rank: partial(TeacherWorker, dataclasses.replace(spec, teachers=teachers)),
        threads=placed.threads,
        timeout_s=placed.timeout_s,
    )
    ranks = RayRanks(ROLE, actors, timeout_s=placed.timeout_s)
    try:
        ranks.call_processes("init", RankProcess.start)
        ranks.nodes = ranks.call_processes("init", RankProcess.node_id)
    except BaseException:
        ranks.stop("failed to start")
        raise
    placed.nodes[ROLE] = ranks.nodes
    policy.place_teacher(ranks)
    return ranks


def pool_of_teacher(plan: PlacementPlan) -> ResourcePool:
    """The pool `plan` places the teacher on, or `PlacementError` naming the keys."""
    if ROLE not in plan.roles:
        problem = f"the {plan.name!r} plan places no teacher (make the plan with {ROLE!r} among its roles)"
        raise PlacementError([PlacementProblem(("cluster.placement", "distillation.enabled"), problem)])
    return plan.pool_of(ROLE)
