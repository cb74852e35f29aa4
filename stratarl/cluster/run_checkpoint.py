"""Layer 3, orchestration: one checkpoint of a run's workers — the trained roles, saved together.

The policy worker's actor and, for PPO, the critic's value model are published by one
`engine.checkpoint.CheckpointManager` save (atomic: the whole step or nothing), with the policy's
HF export and the trainer's own state (`trainer_state.pt`) beside them. The critic may live in
other processes than the policy (its own Ray ranks), so it writes its part first, staged outside
any checkpoint (`stage_checkpoint`); the policy's save then moves it in before the manifest. A
crash between the two parts leaves no global_step_N, so a resume takes the previous checkpoint.
The layout is the same for an in-process and a Ray critic (`critic/{model,optimizer,extra}.pt`).
A load restores the policy from the newest complete step (verified against its manifest, which
covers the critic's files too), then the critic from that same step. Each checkpoint's trainer
state records the run (`lineage`) that wrote it, and retention removes only that run's older
checkpoints. The trainer decides when to save and which checkpoint to resume
(`run_directory/checkpointing.py`); this handle knows where the roles live.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from stratarl.cluster.critic_worker import CHECKPOINT_ROLE
from stratarl.cluster.handles import CheckpointRequest, CriticLifecycle, PolicyLifecycle
from stratarl.engine.checkpoint import CheckpointManager, LoadedCheckpoint


class RunCheckpoint:
    """Save and load the trained roles of `policy` and `critic` (their worker groups, in-process or
    over Ray ranks) under `root`/global_step_N."""

    def __init__(
        self,
        root: str | Path,
        *,
        policy: PolicyLifecycle,
        critic: CriticLifecycle | None = None,
        max_to_keep: int | None = None,
        lineage: str | None = None,
    ):
        self.manager = CheckpointManager(root)  # listing and retention; the policy's ranks write
        self.policy, self.critic = policy, critic
        self.max_to_keep, self.lineage = max_to_keep, lineage

    @property
    def root(self) -> Path:
        return self.manager.root

    def steps(self) -> list[int]:
        return self.manager.steps()

    def save(self, step: int, *, tokenizer: Any, trainer_state: dict[str, Any]) -> Path:
        """global_step_{step}: actor (+ critic) model, optimizer, schedule; RNG; HF export; state."""
        staged: tuple[str, ...] = ()
        if self.critic is not None:
            self.critic.stage_checkpoint(self.root, step)  # not a checkpoint until the policy's save
            staged = (CHECKPOINT_ROLE,)
        request = CheckpointRequest(
            step,
            tokenizer=tokenizer,
            trainer_state=trainer_state | {"lineage": self.lineage},
            staged_roles=staged,
        )
        path = self.policy.save_checkpoint(self.root, request)
        if self.max_to_keep is not None:
            self.manager.prune(self.max_to_keep, newest=step, belongs=self._of_this_run)
        return path

    def _of_this_run(self, directory: Path) -> bool:
        """Whether checkpoint `directory` was written by this run (its trainer state's lineage)."""
        state_file = directory / "trainer_state.pt"
        if self.lineage is None or not state_file.is_file():
            return False
        return torch.load(state_file, weights_only=False).get("lineage") == self.lineage

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
