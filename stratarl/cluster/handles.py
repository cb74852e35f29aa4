"""Layer 3, orchestration: the handles the trainer holds — what it may ask of the policy and the critic.

Each protocol is one reason to change, so that a phase types against the narrow one it uses:

- compute (`PolicyCompute`, `CriticCompute`): generation, log-probs, reference log-probs, the
  updates and their per-row statistics; values — what a phase computes;
- weights (`PolicyWeights`): `sync_weights`, `weight_version` — how the actor reaches the rollout;
- data path (`PolicyDataPath`, `Traffic`): `materialize`, `clear_queue`, `queue_collection`,
  `controller_bytes` — how rows travel (directly, or through the TransferQueue);
- lifecycle (`PolicyLifecycle`, `CriticLifecycle`, over `GroupProcesses`): checkpoints,
  `save_pretrained`; `placement`, stack dumps, `shutdown` — where the processes run and how they
  save and stop.

`PolicyHandle` and `CriticHandle` are their unions: what the trainer holds for a whole run.
`worker_group.PolicyWorkerGroup` and `critic_group.CriticWorkerGroup` implement them over one
in-process rank or over Ray ranks alike, so `fit()` runs unchanged on both backends (and a test may
hand a phase any object that has the methods it uses). Each method's body in the group shows where
the batch goes. The options of a call travel as one frozen request (`UpdateRequest`,
`ScoreRequest`, from `engine/requests.py`; re-exported here for the trainer, which does not import
the engine).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Protocol

from torch import Tensor

from stratarl.cluster.specs import DEFAULT_TEACHER
from stratarl.engine.checkpoint import LoadedCheckpoint
from stratarl.engine.requests import LOG_PROBS_ONLY, CheckpointRequest, ScoreRequest, UpdateRequest
from stratarl.engine.training import LossFn
from stratarl.rollout.interface import RolloutEngine, SamplingParams
from stratarl.rollout.weight_sync import WeightLoadReport
from stratarl.transport.data_proto import DataProto

__all__ = [
    "DEFAULT_TEACHER",
    "CheckpointRequest",
    "CriticCompute",
    "CriticHandle",
    "CriticLifecycle",
    "GroupProcesses",
    "PolicyCompute",
    "PolicyDataPath",
    "PolicyHandle",
    "PolicyLifecycle",
    "PolicyWeights",
    "ScoreRequest",
    "Traffic",
    "UpdateRequest",
]


# --- shared by every worker group ----------------------------------------------------------------
class GroupProcesses(Protocol):
    """Where a group's processes run, their stacks when a phase hangs, and their end."""

    def placement(self) -> dict[str, list[str]]:
        """Role -> where each of its processes runs (Ray node ids, or this process)."""
        ...

    def arm_stack_dumps(self, folder: str | Path) -> list[str]: ...

    def dump_stacks(self, folder: str | Path, header: str) -> list[str]: ...

    def shutdown(self) -> None: ...


class Traffic(Protocol):
    """What crossed process boundaries through the controller since the last call."""

    def controller_bytes(self) -> dict[str, float]: ...


# --- the policy: rollout, actor, reference ---------------------------------------------------------
class PolicyCompute(Protocol):
    """The policy's compute calls: generation, scoring, the actor update and its per-row statistics."""

    @property
    def rollout(self) -> RolloutEngine:
        """The generation engines as one engine (what an agent loop drives)."""
        ...

    def generate(
        self, prompts: DataProto, sampling: SamplingParams, *, seed: int | None = None
    ) -> DataProto: ...

    def compute_log_prob(self, batch: DataProto, request: ScoreRequest = LOG_PROBS_ONLY) -> DataProto: ...

    def compute_ref_log_prob(self, batch: DataProto) -> DataProto: ...

    def compute_teacher_log_prob(self, batch: DataProto, teacher: str = DEFAULT_TEACHER) -> DataProto: ...

    def update_actor(self, batch: DataProto, loss_fn: LossFn, request: UpdateRequest) -> dict[str, float]: ...

    def update_row_statistics(self) -> dict[str, Tensor]: ...


class PolicyWeights(Protocol):
    """The actor's weights on their way to the rollout engines, and the version the engines serve."""

    @property
    def weight_version(self) -> int: ...

    def sync_weights(self, version: int | None = None) -> WeightLoadReport: ...


class PolicyDataPath(Traffic, Protocol):
    """The rows of a step where they are kept (the TransferQueue on Ray; nothing in one process)."""

    def materialize(self, batch: DataProto) -> DataProto: ...

    def clear_queue(self, through: int | None = None) -> int: ...

    def queue_collection(self, step: int) -> contextlib.AbstractContextManager[None]: ...


class PolicyLifecycle(GroupProcesses, Protocol):
    """The policy's processes, its checkpoints and its export."""

    def save_pretrained(self, out_dir: str | Path) -> Path: ...

    def save_checkpoint(self, root: str | Path, request: CheckpointRequest) -> Path: ...

    def load_checkpoint(self, root: str | Path, *, step: int | None = None) -> LoadedCheckpoint | None: ...


class PolicyHandle(PolicyCompute, PolicyWeights, PolicyDataPath, PolicyLifecycle, Protocol):
    """The policy's roles — rollout, actor, reference — behind one handle: everything above."""


# --- the critic: PPO's value model -----------------------------------------------------------------
class CriticCompute(Protocol):
    """The critic's compute calls: values before the advantage, the value-model update."""

    def compute_values(self, batch: DataProto) -> DataProto: ...

    def update_critic(
        self, batch: DataProto, loss_fn: LossFn, request: UpdateRequest
    ) -> dict[str, float]: ...


class CriticLifecycle(GroupProcesses, Protocol):
    """The critic's processes and its part of a checkpoint (staged first, moved in by the policy)."""

    def save_pretrained(self, out_dir: str | Path) -> Path: ...

    def stage_checkpoint(self, root: str | Path, step: int) -> Path: ...

    def load_checkpoint(self, root: str | Path, step: int) -> None: ...


class CriticHandle(CriticCompute, CriticLifecycle, Traffic, Protocol):
    """PPO's value model behind one handle: everything above."""
