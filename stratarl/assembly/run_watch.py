"""Assembly: the run's watchdog from `watchdog.*`, and the worker processes it can dump.

Every phase of `fit()` runs under a deadline (`observe.watchdog`). The worker groups' processes —
Ray ranks, rollout replicas and the reward model's process — are armed at the start, so that a
passed deadline (or a Ray call that outlives cluster.call_timeout_s) leaves the stacks of every
process in <run_dir>/hang/.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stratarl.config import RunConfig
from stratarl.observe.stack_dumps import HANG_DIR
from stratarl.observe.watchdog import Watchdog, deadline_policy

# The role that runs each watched phase (what a passed deadline names beside the phase).
PHASE_ROLES = {
    "gen": "rollout",
    "gen_max": "rollout",
    "wait_rollout": "rollout (the producer thread of trainer.mode=one_step_off/async)",
    "reward": "reward",
    "old_log_prob": "actor",
    "ref": "reference",
    "values": "critic",
    "update_critic": "critic",
    "update_actor": "actor",
    "update_weights": "actor → rollout (weight sync)",
    "val": "rollout + reward (validation)",
    "save": "actor (checkpoint)",
}


def build_watchdog(cfg: RunConfig, run_dir: str | Path) -> Watchdog | None:
    """The watchdog of `cfg.watchdog`, or None when watchdog.enable is false."""
    w = cfg.watchdog
    if not w.enable:
        return None
    policy = deadline_policy(
        phase_timeouts_s=w.phase_timeouts_s,
        initial_timeout_s=w.initial_timeout_s,
        warmup_steps=w.warmup_steps,
        scale=w.scale,
        floor_s=w.floor_s,
    )
    return Watchdog(run_dir, policy, grace_s=w.grace_s)


def watched_workers(policy: Any, critic: Any = None, rewards: Any = None) -> dict[str, Any]:
    """The handles whose processes the watchdog arms, by name: the policy's group, the critic's
    (None without one) and the reward model's (None without one; `rewards`: the `RewardManager`)."""
    return {"actor": policy, "critic": critic, "reward_model": getattr(rewards, "model", None)}


def watch_workers(watchdog: Watchdog, run_dir: str | Path, workers: dict[str, Any]) -> list[str]:
    """Arm each worker handle's processes (a no-op in one process) and let the watchdog dump them;
    returns a line per armed process."""
    folder = Path(run_dir) / HANG_DIR
    lines = []
    for name, worker in workers.items():
        if worker is None:
            continue
        lines += worker.arm_stack_dumps(folder)
        watchdog.add_dumper(name, worker.dump_stacks)
    return lines
