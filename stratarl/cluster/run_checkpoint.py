"""Layer 3, orchestration: one checkpoint of a run's workers — the trained roles, saved together.

The policy worker's actor and, for PPO, the critic's value model are published by one
`engine.checkpoint.CheckpointManager` save (atomic: the whole step or nothing), with the policy's
HF export and the trainer's own state (`trainer_state.pt`) beside them. The critic may live in
other processes than the policy (its own Ray ranks), so it writes its part first, staged outside
any checkpoint (`stage_checkpoint`); the policy's save then moves it in before the manifest. A
crash between the two parts leaves no global_step_N, so a resume takes the previous checkpoint.
The layout is the same for an in-process and a Ray critic (`critic/{model,optimizer,extra}.pt`).
A load restores the policy from the newest complete step (verified against its manifest, which
covers the critic's files too), then the critic from that same step. The trainer decides when to
save and which checkpoint to resume (`trainer/checkpointing.py`); this handle knows where the roles live.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stratarl.cluster.critic_worker import CHECKPOINT_ROLE
from stratarl.cluster.handles import CriticHandle, PolicyHandle
from stratarl.engine.checkpoint import CheckpointManager, LoadedCheckpoint


class RunCheckpoint:
    """Save and load the trained roles of `policy` and `critic` (their worker groups, in-process or
    over Ray ranks) under `root`/global_step_N."""

    def __init__(
        self,
        root: str | Path,
        *,
        policy: PolicyHandle,
        critic: CriticHandle | None = None,
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

    def save(self, step: int, *, tokenizer: Any, trainer_state: dict[str, Any]) -> Path:
        """global_step_{step}: actor (+ critic) model, optimizer, schedule; RNG; HF export; state."""
        staged = []
        if self.critic is not None:
            self.critic.stage_checkpoint(self.root, step)  # not a checkpoint until the policy's save
            staged.append(CHECKPOINT_ROLE)
        return self.policy.save_checkpoint(
            self.root,
            step,
            staged_roles=staged,
            tokenizer=tokenizer,
            trainer_state=trainer_state,
            max_to_keep=self.max_to_keep,
        )

    def load(self, *, directory: str | Path | None = None) -> LoadedCheckpoint | None:
        """Restore the newest complete checkpoint under root (or `directory`, a global_step_N dir)
        into the roles and the RNG states; None when there is none."""
        if directory is None:
            root, step = self.root, None
        else:
            directory = Path(directory)
            root, step = directory.parent, int(directory.name.removeprefix("global_step_"))
        loaded = self.policy.load_checkpoint(root, step=step)
        if loaded is not None and self.critic is not None:
            self.critic.load_checkpoint(root, loaded.step)
        return loaded
