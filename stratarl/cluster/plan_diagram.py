"""Layer 3, orchestration: placement plans drawn as Mermaid flowcharts, from the plan objects themselves.

docs/architecture.md shows the colocated and split plans (colocated PPO too, whose critic has a
process of its own on each training bundle, and runs with a reward model or a distillation teacher,
each of which has a pool of its own) through these drawings; the section between the markers is
regenerated with `python -m stratarl.cluster.plan_diagram docs/architecture.md` and a test keeps it
current, so the pictures cannot drift from the code.
"""

from __future__ import annotations

import sys
from pathlib import Path

from stratarl.cluster.placement import (
    SEPARATE_PROCESS_ROLES,
    SIZE_KEYS,
    PlacementPlan,
    ResourcePool,
    WorkerSizes,
    make_plan,
)

START, END = "<!-- placement-diagrams:start -->", "<!-- placement-diagrams:end -->"

# The plans the docs draw, with this machine's settings (2 CPUs): (plan, sizes, roles, extra overrides).
GRPO_ROLES = ("actor", "rollout", "reference")
DOC_PLANS = {
    "colocated": ("colocated", WorkerSizes(training_workers=2), GRPO_ROLES, ""),
    "split": (
        "split",
        WorkerSizes(training_workers=2, rollout_replicas=1, cpus_per_training_worker=0.5),
        GRPO_ROLES,
        "",
    ),
    "colocated-ppo": (
        "colocated",
        WorkerSizes(training_workers=2),
        (*GRPO_ROLES, "critic"),
        " algorithm.adv_estimator=gae critic.enable=true",
    ),
    "colocated-reward-model": (
        "colocated",
        WorkerSizes(training_workers=2, cpus_per_training_worker=0.5),
        (*GRPO_ROLES, "reward_model"),
        " reward.model.enable=true",
    ),
    "colocated-teacher": (
        "colocated",
        WorkerSizes(training_workers=2, cpus_per_training_worker=0.5),
        (*GRPO_ROLES, "teacher"),
        " distillation.enabled=true",
    ),
}


def _resources(pool: ResourcePool) -> str:
    bundle = pool.bundles[0]
    amounts = ", ".join(f"{name} {amount:g}" for name, amount in bundle.as_ray().items())
    sharing = (
        f", {pool.processes_per_bundle} processes take turns on each" if pool.processes_per_bundle > 1 else ""
    )
    return f"{pool.world_size} × {{{amounts}}}{sharing}"


def render_mermaid(plan: PlacementPlan) -> str:
    """A flowchart: one subgraph per pool, one node per process with the roles it hosts (a critic
    in a process of its own on the same bundle), and the paths data takes: controller → processes
    (prompts, shard references), rows between the processes and the TransferQueue, collectives
    between ranks, weights to the rollout; the reward model reads conversations from the controller
    and answers with scores (no rows in the queue); a teacher reads its rows' tokens from the queue
    and writes its columns there."""
    lines = [
        "flowchart LR",
        '  controller["controller: the trainer process"]',
        '  queue[("TransferQueue<br/>storage units")]',
    ]
    training = plan.pool_of("actor") if "actor" in plan.roles else None
    groups: list[list[str]] = []  # the ranks of each torch.distributed group
    for pool in plan.pools:
        lines.append(f'  subgraph {pool.name}["pool {pool.name}: {_resources(pool)}"]')
        for label, roles in _processes(plan, pool):
            names = [f"{pool.name}{i}{label}" for i in range(pool.world_size)]
            lines += [f'    {name}["process {i}<br/>{" · ".join(roles)}"]' for i, name in enumerate(names)]
            if pool is training:
                groups.append(names)
        lines.append("  end")
    for pool in plan.pools:
        for label, roles in _processes(plan, pool):
            if roles == ["reward_model"]:
                lines += [
                    f"  controller <-->|conversations · scores| {pool.name}{i}"
                    for i in range(pool.world_size)
                ]
                continue
            if roles == ["teacher"]:  # it reads its rows' tokens from the queue, writes its columns there
                for i in range(pool.world_size):
                    lines.append(f"  controller -->|shard refs| {pool.name}{i}")
                    lines.append(f"  {pool.name}{i} <-->|tokens · teacher columns| queue")
                continue
            generates, trains = "rollout" in roles, pool is training
            what = " · ".join(["prompts"] * generates + ["shard refs"] * trains)
            for i in range(pool.world_size):
                lines.append(f"  controller -->|{what}| {pool.name}{i}{label}")
                lines.append(f"  {pool.name}{i}{label} {'<-->' if trains else '-->'}|rows| queue")
    lines.append("  controller -->|its columns: scores, advantages| queue")
    for names in groups:
        if len(names) > 1:
            lines.append(f"  {names[0]} <-.->|FSDP2 collectives| {' & '.join(names[1:])}")
    if training is not None and "rollout" in plan.roles and not plan.is_colocated("actor", "rollout"):
        rollout = plan.pool_of("rollout")
        for i in range(rollout.world_size):
            lines.append(f"  {training.name}0 ==>|weights in buckets| {rollout.name}{i}")
    return "\n".join(lines)


def _processes(plan: PlacementPlan, pool: ResourcePool) -> list[tuple[str, list[str]]]:
    """(node-name suffix, roles) of the processes on each bundle: the shared roles in one, each
    separate-process role (the critic) in its own."""
    roles = plan.roles_on(pool.name)
    shared = [role for role in roles if role not in SEPARATE_PROCESS_ROLES]
    separate = [(f"_{role}", [role]) for role in roles if role in SEPARATE_PROCESS_ROLES]
    return ([("", shared)] if shared else []) + separate


def overrides(name: str, sizes: WorkerSizes) -> str:
    """The CLI overrides that select this plan (settings left at their defaults are not repeated)."""
    default = WorkerSizes()
    changed = [
        f"{SIZE_KEYS[f]}={getattr(sizes, f):g}"
        for f in vars(sizes)
        if getattr(sizes, f) != getattr(default, f)
    ]
    return " ".join(["cluster.backend=ray", f"cluster.placement={name}", *changed])


def docs_section() -> str:
    parts = [START]
    for plan_name, sizes, roles, extra in DOC_PLANS.values():
        plan = make_plan(plan_name, sizes, roles)
        command = overrides(plan_name, sizes) + extra
        parts += [f"`{command}`:", "", "```mermaid", render_mermaid(plan), "```", ""]
    parts.append(END)
    return "\n".join(parts)


def update_docs(path: str | Path) -> bool:
    """Rewrite the section between the markers of `path`; True when it changed."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if START not in text or END not in text:
        raise ValueError(f"{path} has no {START} … {END} section")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    new = head + docs_section() + tail
    path.write_text(new, encoding="utf-8")
    return new != text


if __name__ == "__main__":
    print("updated" if update_docs(sys.argv[1]) else "already current")
