"""Layer 3, orchestration: the handles the trainer holds — what it may ask of the policy and the critic.

Every phase types against these protocols, not a class: `worker_group.PolicyWorkerGroup` and
`critic_group.CriticWorkerGroup` implement them over one in-process rank or over Ray ranks alike,
so `fit()` runs unchanged on both backends (and a test may hand a phase any object that has these
methods). Each method's body in the group shows where the batch goes.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Protocol

from torch import Tensor

from stratarl.engine.checkpoint import LoadedCheckpoint
from stratarl.engine.requests import LOG_PROBS_ONLY, ScoreRequest, UpdateRequest
from stratarl.engine.training import LossFn
from stratarl.rollout.interface import RolloutEngine, SamplingParams
from stratarl.rollout.weight_sync import WeightLoadReport
from stratarl.transport.data_proto import DataProto


class PolicyHandle(Protocol):
    """The policy's roles — rollout, actor, reference — behind one handle."""

    @property
    def rollout(self) -> RolloutEngine:
        """The generation engines as one engine (what an agent loop drives)."""
        ...

    @property
    def weight_version(self) -> int: ...

    def generate(
        self, prompts: DataProto, sampling: SamplingParams, *, seed: int | None = None
    ) -> DataProto: ...

    def sync_weights(self, version: int | None = None) -> WeightLoadReport: ...

    def compute_log_prob(self, batch: DataProto, request: ScoreRequest = LOG_PROBS_ONLY) -> DataProto: ...

    def compute_ref_log_prob(self, batch: DataProto) -> DataProto: ...

    def update_actor(self, batch: DataProto, loss_fn: LossFn, request: UpdateRequest) -> dict[str, float]: ...

    def save_pretrained(self, out_dir: str | Path) -> Path: ...

    def save_checkpoint(
        self,
        root: str | Path,
        step: int,
        *,
        tokenizer: Any = None,
        trainer_state: dict[str, Any] | None = None,
        max_to_keep: int | None = None,
        staged_roles: tuple[str, ...] | list[str] = (),
    ) -> Path: ...

    def load_checkpoint(self, root: str | Path, *, step: int | None = None) -> LoadedCheckpoint | None: ...

    def materialize(self, batch: DataProto) -> DataProto: ...

    def clear_queue(self, through: int | None = None) -> int: ...

    def queue_collection(self, step: int) -> contextlib.AbstractContextManager[None]: ...

    def controller_bytes(self) -> dict[str, float]: ...

    def update_row_statistics(self) -> dict[str, Tensor]: ...

    def arm_stack_dumps(self, folder: str | Path) -> list[str]: ...

    def dump_stacks(self, folder: str | Path, header: str) -> list[str]: ...

    def placement(self) -> dict[str, list[str]]:
        """Role -> where each of its processes runs (Ray node ids, or this process)."""
        ...

    def shutdown(self) -> None: ...


class CriticHandle(Protocol):
    """PPO's value model behind one handle."""

    def compute_values(self, batch: DataProto) -> DataProto: ...

    def update_critic(
        self, batch: DataProto, loss_fn: LossFn, request: UpdateRequest
    ) -> dict[str, float]: ...

    def save_pretrained(self, out_dir: str | Path) -> Path: ...

    def stage_checkpoint(self, root: str | Path, step: int) -> Path: ...

    def load_checkpoint(self, root: str | Path, step: int) -> None: ...

    def controller_bytes(self) -> dict[str, float]: ...

    def arm_stack_dumps(self, folder: str | Path) -> list[str]: ...

    def dump_stacks(self, folder: str | Path, header: str) -> list[str]: ...

    def placement(self) -> dict[str, list[str]]: ...

    def shutdown(self) -> None: ...
