"""Shared by the Ray benchmarks (`async_modes.py`, `controller_bytes.py`): the quickstart's task and
tiny model (untrained: the work and bytes per step depend on the shapes, not the skill), and short
GRPO runs of the quickstart recipe on a local Ray cluster with a given placement plan.

Not a benchmark itself; the scripts import it from their own folder (`python benchmarks/NAME.py`).
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from stratarl.apps.quickstart import RECIPE, TaskSettings, build_task
from stratarl.config import load_config
from stratarl.observe.run_log import read_metrics
from stratarl.trainer.rl_trainer import RLTrainer

PLANS = {
    "colocated": ["cluster.training_workers=2"],
    "split": [
        "cluster.placement=split",
        "cluster.training_workers=2",
        "cluster.cpus_per_training_worker=0.5",
    ],
}
QUIET = ["trainer.test_freq=0", "trainer.save_freq=0", "trainer.val_before_train=false"]
QUIET += ["trainer.save_trajectories=false"]


def task_overrides(root: Path, extra: list[str]) -> list[str]:
    """Build the quickstart's data and model under `root`; the overrides that point the recipe at them."""
    paths, model_dir = build_task(root / "task", TaskSettings(), seed=0)
    return [
        f"data.train_files=['{paths['train']}']",
        f"data.val_files=['{paths['test']}']",
        f"model.path={model_dir}",
        *extra,
    ]


def train_metrics(run_dir: Path, base: list[str], plan: str, overrides: list[str], steps: int) -> list[dict]:
    """`steps` GRPO steps on Ray (2 CPUs, `PLANS[plan]`), nothing but the training steps; their metrics."""
    ray = ["cluster.backend=ray", "cluster.num_cpus=2", *PLANS[plan]]
    cfg = load_config(RECIPE, [*base, *ray, *overrides, f"trainer.total_steps={steps}", *QUIET])
    RLTrainer(cfg, run_dir, console=Console(quiet=True)).fit()
    return [m for m in read_metrics(run_dir / "metrics.jsonl") if m.get("phase") == "train"]
