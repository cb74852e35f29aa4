"""Layer 3, orchestration: one checkpoint of a run's workers — the trained roles, saved together.

The policy worker's actor and, for PPO, the critic worker's value model are written by one
`engine.checkpoint.CheckpointManager` save (atomic: the whole step or nothing), with the policy's
HF export and the trainer's own state (`trainer_state.pt`) beside them. The trainer decides when to
save and which checkpoint to resume (`trainer/checkpointing.py`); this handle knows where the roles
live. With data-parallel ranks (issue 8), the same calls run on every rank.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from stratarl.cluster.critic_worker import CriticWorker
from stratarl.cluster.policy_worker import PolicyWorker
from stratarl.engine.checkpoint import CheckpointManager, LoadedCheckpoint

if TYPE_CHECKING:  # imports ray
    from stratarl.cluster.worker_group import PolicyWorkerGroup


class RunCheckpoint:
    """Save and load the trained roles of `policy` (a `PolicyWorker` or a worker group over its
    ranks) and `critic` under `root`/global_step_N."""

    def __init__(
        self,
        root: str | Path,
        *,
        policy: PolicyWorker | PolicyWorkerGroup,
        critic: CriticWorker | None = None,
        max_to_keep: int | None = None,
    ):
        self.manager = CheckpointManager(root, max_to_keep=max_to_keep)  # listing only; the policy writes
        self.policy, self.critic = policy, critic
        self.max_to_keep = max_to_keep

    @property
    def root(self) -> Path:
        return self.manager.root

    def steps(self) -> list[int]:
        return self.manager.steps()

    def _extra_roles(self) -> dict[str, Any]:
        return {"critic": self.critic.critic} if self.critic else {}

    def save(self, step: int, *, tokenizer: Any, trainer_state: dict[str, Any]) -> Path:
        """global_step_{step}: actor (+ critic) model, optimizer, schedule; RNG; HF export; state."""
        return self.policy.save_checkpoint(
            self.root,
            step,
            extra_roles=self._extra_roles(),
            tokenizer=tokenizer,
            trainer_state=trainer_state,
            max_to_keep=self.max_to_keep,
        )

    def load(self, *, directory: str | Path | None = None) -> LoadedCheckpoint | None:
        """Restore the newest complete checkpoint under root (or `directory`, a global_step_N dir)
        into the roles and the RNG states; None when there is none."""
        if directory is None:
            return self.policy.load_checkpoint(self.root, extra_roles=self._extra_roles())
        directory = Path(directory)
        step = int(directory.name.removeprefix("global_step_"))
        return self.policy.load_checkpoint(directory.parent, step=step, extra_roles=self._extra_roles())
