"""Layer 3, orchestration: resource pools and placement plans — which roles run in which processes.

A `ResourcePool` is a list of bundles, the CPUs/GPUs of one worker process each; on Ray it is one
placement group (`ray_cluster.reserve_pools`). A `PlacementPlan` maps each role to a pool. Roles on
the same pool are colocated: one process per bundle hosts all of them and switches between phases
(verl's hybrid engine); roles on different pools run at the same time on different processes.
A role with a model and process group of its own (the critic) placed on a pool adds a second
process to each bundle: the processes of a bundle each ask Ray for an equal share of it (verl's
`max_colocate_count`), so they land on the same node and the same GPU, and each uses all of the
bundle's threads, because they take turns (the phases of a step run one after the other).
The reward model and the distillation teacher, when a run has them, are a pool of their own each in
every plan: one bundle of reward.model.cpus / gpus and of distillation.cpus / gpus, counted and
reserved with the others.
Plans are data, built by name from `PLANS`; `validate_plan` rejects an impossible plan before any
process starts, naming the config keys to change.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

ROLES = ("actor", "rollout", "reference", "critic", "reward_model", "teacher")
STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")  # Ray's placement-group strategies
# Roles hosted by processes of their own even on a shared pool (own model, own torch.distributed
# group), with the config key that adds each to a run. The other roles share the pool's process.
SEPARATE_PROCESS_ROLES = {"critic": "critic.enable"}


@dataclass(frozen=True)
class Bundle:
    """The resources of one worker process. Its torch threads follow its CPU share (at least 1)."""

    cpus: float = 1.0
    gpus: float = 0.0

    @property
    def threads(self) -> int:
        return max(1, int(self.cpus))

    def as_ray(self) -> dict[str, float]:
        """Ray's bundle dict; zero amounts are left out (Ray rejects them)."""
        return {name: amount for name, amount in (("CPU", self.cpus), ("GPU", self.gpus)) if amount > 0}

    def share(self, processes: int) -> Bundle:
        """What each of `processes` processes on this bundle asks Ray for."""
        return Bundle(self.cpus / processes, self.gpus / processes)


@dataclass(frozen=True)
class ResourcePool:
    """`bundles` (rank i of each role on bundle i) placed with a Ray strategy. `keys`: the config
    keys that sized this pool, named by every error about it. `processes_per_bundle`: the worker
    processes that share each bundle, taking turns on it (`Bundle.share`)."""

    name: str
    bundles: tuple[Bundle, ...]
    strategy: str = "PACK"
    keys: tuple[str, ...] = ()
    processes_per_bundle: int = 1

    def process_share(self, index: int) -> Bundle:
        """What one process on bundle `index` asks Ray for (the whole bundle when it has it alone)."""
        return self.bundles[index].share(self.processes_per_bundle)

    @property
    def world_size(self) -> int:
        return len(self.bundles)

    @property
    def cpus(self) -> float:
        return sum(b.cpus for b in self.bundles)

    @property
    def gpus(self) -> float:
        return sum(b.gpus for b in self.bundles)


@dataclass(frozen=True)
class PlacementPlan:
    """Pools, and the pool of each role (`roles`: role -> pool name)."""

    name: str
    pools: tuple[ResourcePool, ...]
    roles: Mapping[str, str] = field(default_factory=dict)

    def pool(self, name: str) -> ResourcePool:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(f"plan {self.name!r} has no pool {name!r}; pools: {[p.name for p in self.pools]}")

    def pool_of(self, role: str) -> ResourcePool:
        if role not in self.roles:
            raise KeyError(f"plan {self.name!r} places no {role!r}; it places {sorted(self.roles)}")
        return self.pool(self.roles[role])

    def roles_on(self, pool_name: str) -> list[str]:
        """The roles a process of this pool hosts, in `ROLES` order."""
        return [role for role in ROLES if self.roles.get(role) == pool_name]

    def is_colocated(self, role: str, other: str) -> bool:
        return role in self.roles and self.roles.get(other) == self.roles[role]


@dataclass(frozen=True)
class WorkerSizes:
    """How many processes of each kind, and the resources of each (`cluster.*` settings)."""

    training_workers: int = 1
    rollout_replicas: int = 1
    cpus_per_training_worker: float = 1.0
    cpus_per_rollout_replica: float = 1.0
    gpus_per_training_worker: float = 0.0
    gpus_per_rollout_replica: float = 0.0
    reward_model_cpus: float = 1.0
    reward_model_gpus: float = 0.0
    teacher_cpus: float = 1.0
    teacher_gpus: float = 0.0


# The config key that sets each `WorkerSizes` field.
SIZE_KEYS = {
    "training_workers": "cluster.training_workers",
    "rollout_replicas": "cluster.rollout_replicas",
    "cpus_per_training_worker": "cluster.cpus_per_training_worker",
    "cpus_per_rollout_replica": "cluster.cpus_per_rollout_replica",
    "gpus_per_training_worker": "cluster.gpus_per_training_worker",
    "gpus_per_rollout_replica": "cluster.gpus_per_rollout_replica",
    "reward_model_cpus": "reward.model.cpus",
    "reward_model_gpus": "reward.model.gpus",
    "teacher_cpus": "distillation.cpus",
    "teacher_gpus": "distillation.gpus",
}
TRAINING_KEYS = (
    "cluster.training_workers",
    "cluster.cpus_per_training_worker",
    "cluster.gpus_per_training_worker",
)
ROLLOUT_KEYS = (
    "cluster.rollout_replicas",
    "cluster.cpus_per_rollout_replica",
    "cluster.gpus_per_rollout_replica",
)
REWARD_MODEL_KEYS = ("reward.model.cpus", "reward.model.gpus")
TEACHER_KEYS = ("distillation.cpus", "distillation.gpus")


def _bundles(count: int, cpus: float, gpus: float) -> tuple[Bundle, ...]:
    return tuple(Bundle(cpus, gpus) for _ in range(count))


def processes_for(roles: Sequence[str]) -> int:
    """Processes per bundle of a pool hosting `roles`: one per separate-process role, plus one
    for all the others."""
    separate = sum(role in SEPARATE_PROCESS_ROLES for role in roles)
    shared = 1 if separate < len(roles) else 0
    return max(1, separate + shared)


def colocated_plan(
    sizes: WorkerSizes, roles: Sequence[str] = ("actor", "rollout", "reference")
) -> PlacementPlan:
    """One pool of `training_workers` bundles; each process hosts every role (rollout_replicas is
    unused: every process serves generation between its training phases), a critic has a process
    of its own on each bundle; a reward model and a teacher have their pools (`OWN_POOLS`)."""
    policy_roles = [role for role in roles if role not in OWN_POOLS]
    pool = ResourcePool(
        "policy",
        _bundles(sizes.training_workers, sizes.cpus_per_training_worker, sizes.gpus_per_training_worker),
        keys=TRAINING_KEYS,
        processes_per_bundle=processes_for(policy_roles),
    )
    return _with_own_pools(
        PlacementPlan("colocated", (pool,), {role: "policy" for role in policy_roles}), sizes, roles
    )


def split_plan(sizes: WorkerSizes, roles: Sequence[str] = ("actor", "rollout", "reference")) -> PlacementPlan:
    """Rollout replicas on their own pool; a reward model and a teacher on theirs (`OWN_POOLS`); every
    other role on the training pool."""
    policy_roles = [role for role in roles if role not in OWN_POOLS]
    training = ResourcePool(
        "training",
        _bundles(sizes.training_workers, sizes.cpus_per_training_worker, sizes.gpus_per_training_worker),
        keys=TRAINING_KEYS,
        processes_per_bundle=processes_for([role for role in policy_roles if role != "rollout"]),
    )
    rollout = ResourcePool(
        "rollout",
        _bundles(sizes.rollout_replicas, sizes.cpus_per_rollout_replica, sizes.gpus_per_rollout_replica),
        keys=ROLLOUT_KEYS,
    )
    placed = {role: "rollout" if role == "rollout" else "training" for role in policy_roles}
    return _with_own_pools(PlacementPlan("split", (training, rollout), placed), sizes, roles)


def reward_model_pool(sizes: WorkerSizes) -> ResourcePool:
    """The reward model's pool: one process (it is not sharded) with reward.model.cpus / gpus."""
    bundle = Bundle(sizes.reward_model_cpus, sizes.reward_model_gpus)
    return ResourcePool("reward_model", (bundle,), keys=REWARD_MODEL_KEYS)


def teacher_pool(sizes: WorkerSizes) -> ResourcePool:
    """The distillation teacher's pool: one process (its models are not sharded) with
    distillation.cpus / gpus."""
    return ResourcePool("teacher", (Bundle(sizes.teacher_cpus, sizes.teacher_gpus),), keys=TEACHER_KEYS)


OWN_POOLS: dict[str, Callable[[WorkerSizes], ResourcePool]] = {
    "reward_model": reward_model_pool,
    "teacher": teacher_pool,
}


def _with_own_pools(plan: PlacementPlan, sizes: WorkerSizes, roles: Sequence[str]) -> PlacementPlan:
    """`plan` with the pool of each role of `roles` that has one of its own (`OWN_POOLS`)."""
    own = [role for role in OWN_POOLS if role in roles]
    pools = (*plan.pools, *(OWN_POOLS[role](sizes) for role in own))
    return PlacementPlan(plan.name, pools, {**plan.roles, **{role: role for role in own}})


PLANS: dict[str, Callable[..., PlacementPlan]] = {"colocated": colocated_plan, "split": split_plan}


def make_plan(
    name: str, sizes: WorkerSizes, roles: Sequence[str] = ("actor", "rollout", "reference")
) -> PlacementPlan:
    if name not in PLANS:
        raise PlacementError(
            [PlacementProblem(("cluster.placement",), f"unknown plan {name!r}; valid: {sorted(PLANS)}")]
        )
    return PLANS[name](sizes, roles)


# --- validation ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlacementProblem:
    keys: tuple[str, ...]
    message: str

    def __str__(self) -> str:
        return f"{', '.join(self.keys)}: {self.message}"


class PlacementError(ValueError):
    """An impossible plan; `problems` lists every problem, each naming the config keys involved."""

    def __init__(self, problems: Sequence[PlacementProblem]):
        self.problems = list(problems)
        lines = [f"impossible placement ({len(self.problems)} problem(s)):"]
        super().__init__("\n".join(lines + [f"  - {p}" for p in self.problems]))

    @property
    def keys(self) -> set[str]:
        return {key for problem in self.problems for key in problem.keys}


def validate_plan(
    plan: PlacementPlan,
    *,
    roles: Sequence[str],
    cluster_cpus: float,
    cluster_gpus: float = 0.0,
    rows_per_rank_split: Mapping[tuple[str, ...], int] | None = None,
) -> None:
    """Raise `PlacementError` unless every role in `roles` has a pool, the pools fit the cluster, and
    each batch in `rows_per_rank_split` (its rows, keyed by the config keys that set them) divides
    evenly over the ranks of the training pool."""
    problems = _role_problems(plan, roles) + _pool_problems(plan) + _sharing_problems(plan)
    problems += _capacity_problems(plan, cluster_cpus, cluster_gpus)
    if "actor" in plan.roles and plan.roles["actor"] in {p.name for p in plan.pools}:
        ranks = plan.pool_of("actor").world_size
        for keys, rows in (rows_per_rank_split or {}).items():
            if ranks > 0 and rows % ranks:
                problems.append(
                    PlacementProblem(
                        (*keys, "cluster.training_workers"),
                        f"{rows} rows do not split evenly over {ranks} training workers",
                    )
                )
    if problems:
        raise PlacementError(problems)


def _role_problems(plan: PlacementPlan, roles: Sequence[str]) -> list[PlacementProblem]:
    names = {p.name for p in plan.pools}
    problems = [
        PlacementProblem(("cluster.placement",), f"role {role!r} is unknown; roles: {list(ROLES)}")
        for role in [*roles, *plan.roles]
        if role not in ROLES
    ]
    problems += [
        PlacementProblem(("cluster.placement",), f"role {role!r} has no pool in the {plan.name!r} plan")
        for role in roles
        if role not in plan.roles
    ]
    problems += [
        PlacementProblem(
            ("cluster.placement",), f"role {role!r} is placed on pool {pool!r}, which the plan lacks"
        )
        for role, pool in plan.roles.items()
        if pool not in names
    ]
    return problems


def _pool_problems(plan: PlacementPlan) -> list[PlacementProblem]:
    problems = []
    for pool in plan.pools:
        keys = pool.keys or ("cluster.placement",)
        if pool.world_size < 1:
            problems.append(PlacementProblem(keys, f"pool {pool.name!r} has no process"))
        if pool.strategy not in STRATEGIES:
            problems.append(
                PlacementProblem(keys, f"pool {pool.name!r}: strategy {pool.strategy!r} not in {STRATEGIES}")
            )
        for amount in {a for b in pool.bundles for a in (b.cpus, b.gpus)}:
            if amount < 0 or (amount > 1 and amount != int(amount)):
                problems.append(
                    PlacementProblem(
                        keys, f"pool {pool.name!r}: {amount} is not a share ≤ 1 or a whole number"
                    )
                )
        if any(not b.as_ray() for b in pool.bundles):
            problems.append(PlacementProblem(keys, f"pool {pool.name!r}: a process needs some CPU or GPU"))
    return problems


def _sharing_problems(plan: PlacementPlan) -> list[PlacementProblem]:
    """A bundle shared by k processes must give them the same devices: Ray hands a request of one
    whole GPU or more its own GPUs, so a shared bundle may hold at most one."""
    problems = []
    for pool in plan.pools:
        if pool.processes_per_bundle < 2:
            continue
        sharing = [role for role in plan.roles_on(pool.name) if role in SEPARATE_PROCESS_ROLES]
        keys = (*(pool.keys or ("cluster.placement",)), *(SEPARATE_PROCESS_ROLES[r] for r in sharing))
        for gpus in sorted({b.gpus for b in pool.bundles if b.gpus > 1}):
            problems.append(
                PlacementProblem(
                    keys,
                    f"pool {pool.name!r}: {pool.processes_per_bundle} processes ({', '.join(sharing)} and "
                    f"the rest) share each bundle of {gpus:g} GPUs; Ray would give each its own GPUs "
                    "instead of letting them take turns on the same ones: use at most 1 GPU per "
                    "training worker (more training workers instead)",
                )
            )
    return problems


def _capacity_problems(
    plan: PlacementPlan, cluster_cpus: float, cluster_gpus: float
) -> list[PlacementProblem]:
    problems = []
    for unit, wanted, have in (("CPU", sum(p.cpus for p in plan.pools), cluster_cpus),
                               ("GPU", sum(p.gpus for p in plan.pools), cluster_gpus)):  # fmt: skip
        if wanted > have + 1e-9:
            keys = tuple(dict.fromkeys(k for p in plan.pools for k in p.keys))
            per_pool = ", ".join(f"{p.name} {p.cpus if unit == 'CPU' else p.gpus:g}" for p in plan.pools)
            problems.append(
                PlacementProblem(
                    (*keys, "cluster.num_cpus" if unit == "CPU" else "cluster.device"),
                    f"the plan needs {wanted:g} {unit}s ({per_pool}), the cluster has {have:g}",
                )
            )
    return problems
