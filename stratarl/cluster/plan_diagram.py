"""Layer 3, orchestration: placement plans drawn as Mermaid flowcharts, from the plan objects themselves.

docs/architecture.md shows the colocated and split plans through these drawings; the section
between the markers is regenerated with `python -m stratarl.cluster.plan_diagram docs/architecture.md`
and a test keeps it current, so the pictures cannot drift from the code.
"""

from __future__ import annotations

import sys
from pathlib import Path

from stratarl.cluster.placement import PlacementPlan, ResourcePool, WorkerSizes, make_plan

START, END = "<!-- placement-diagrams:start -->", "<!-- placement-diagrams:end -->"

# The plans the docs draw: this machine's settings (2 CPUs) for both placements.
DOC_PLANS = {
    "colocated": WorkerSizes(training_workers=2),
    "split": WorkerSizes(training_workers=2, rollout_replicas=1, cpus_per_training_worker=0.5),
}


def _resources(pool: ResourcePool) -> str:
    bundle = pool.bundles[0]
    amounts = ", ".join(f"{name} {amount:g}" for name, amount in bundle.as_ray().items())
    return f"{pool.world_size} × {{{amounts}}}"


def render_mermaid(plan: PlacementPlan) -> str:
    """A flowchart: one subgraph per pool, one node per process with the roles it hosts, and the
    paths data takes (controller → ranks, collectives between ranks, weights to the rollout)."""
    lines = ["flowchart LR", '  controller["controller: the trainer process"]']
    for pool in plan.pools:
        lines.append(f'  subgraph {pool.name}["pool {pool.name}: {_resources(pool)}"]')
        roles = " · ".join(plan.roles_on(pool.name)) or "(no role)"
        for i in range(pool.world_size):
            lines.append(f'    {pool.name}{i}["process {i}<br/>{roles}"]')
        lines.append("  end")
    training = plan.pool_of("actor") if "actor" in plan.roles else None
    for pool in plan.pools:
        what = "batch shares" if pool is training else "prompts"
        for i in range(pool.world_size):
            lines.append(f"  controller -->|{what}| {pool.name}{i}")
    if training is not None and training.world_size > 1:
        ranks = " & ".join(f"{training.name}{i}" for i in range(1, training.world_size))
        lines.append(f"  {training.name}0 <-.->|FSDP2 collectives| {ranks}")
    if training is not None and "rollout" in plan.roles and not plan.is_colocated("actor", "rollout"):
        rollout = plan.pool_of("rollout")
        for i in range(rollout.world_size):
            lines.append(f"  {training.name}0 ==>|weights in buckets| {rollout.name}{i}")
    return "\n".join(lines)


def overrides(name: str, sizes: WorkerSizes) -> str:
    """The CLI overrides that select this plan (settings left at their defaults are not repeated)."""
    default = WorkerSizes()
    changed = [
        f"cluster.{f}={getattr(sizes, f):g}" for f in vars(sizes) if getattr(sizes, f) != getattr(default, f)
    ]
    return " ".join(["cluster.backend=ray", f"cluster.placement={name}", *changed])


def docs_section() -> str:
    parts = [START]
    for name, sizes in DOC_PLANS.items():
        plan = make_plan(name, sizes)
        parts += [f"`{overrides(name, sizes)}`:", "", "```mermaid", render_mermaid(plan), "```", ""]
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
