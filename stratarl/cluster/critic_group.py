"""Layer 3, orchestration: the critic's worker group — `CriticWorker`'s methods over D data-parallel ranks.

The trainer holds a `CriticWorker` (in-process) or a `CriticWorkerGroup` and calls both the same
way. As in the policy's group (`worker_group`), each method names its phase and the worker method
the ranks run, and `path` carries the rows: `dispatch.DirectDispatch` (padded scoring shares for
values, per-mini-batch update shares with zero-weight pad rows, gathered in row order) or, on Ray,
the policy's TransferQueue (`QueueRows`): the ranks read their rows there and write their values
back, the controller sends references. Checkpoint calls are one-to-all: the ranks gather their
shards together.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stratarl.cluster.critic_rank import CriticSpec
from stratarl.cluster.critic_worker import CriticWorker
from stratarl.cluster.dispatch import DirectDispatch
from stratarl.cluster.queue_rows import QueueRows
from stratarl.cluster.ranks import InProcessRanks, RayRanks
from stratarl.cluster.worker_group import SCORING_COLUMNS
from stratarl.engine.training import LossFn
from stratarl.transport.data_proto import DataProto


class CriticWorkerGroup:
    """The critic's ranks behind `CriticWorker`'s methods.

    ranks: `InProcessRanks` of `CriticWorker`s or `RayRanks` of `CriticRank` actors (rank r = shard r).
    linear_coeff: the a of the a·s + s² work estimate that balances rows over ranks.
    queue_rows: the policy's TransferQueue rows (Ray), or None: batches travel as DataProto.
    """

    def __init__(
        self,
        ranks: InProcessRanks | RayRanks,
        *,
        linear_coeff: float = 0.0,
        queue_rows: QueueRows | None = None,
    ):
        self.ranks, self.linear_coeff, self.rows = ranks, linear_coeff, queue_rows
        self.path = queue_rows or DirectDispatch(linear_coeff)  # as in `PolicyWorkerGroup`

    @classmethod
    def in_process(cls, spec: CriticSpec) -> CriticWorkerGroup:
        """The embedded backend: one `CriticWorker` in this process."""
        return cls(InProcessRanks("critic", [CriticWorker(**spec.worker_kwargs())]))

    @property
    def size(self) -> int:
        return self.ranks.size

    def compute_values(self, batch: DataProto) -> DataProto:
        """[N, T] `values` of every row: each rank scores a balanced share (pad rows dropped after);
        through the queue, the ranks also store them there for the update to read."""
        return self.path.score(self.ranks, "critic.value", "compute_values", batch, SCORING_COLUMNS)

    def update_critic(
        self,
        batch: DataProto,
        loss_fn: LossFn,
        *,
        mini_batch_size: int,
        epochs: int = 1,
        shuffle_seed: int | None = None,
    ) -> dict[str, float]:
        """Each rank takes its share of every global mini-batch (`dispatch.split_for_update`); the
        ranks average their metrics among themselves, so rank 0's are the group's."""
        options: dict[str, Any] = dict(epochs=epochs, shuffle_seed=shuffle_seed)
        metrics, split = self.path.update(
            self.ranks,
            "critic.update",
            "update_critic",
            batch,
            loss_fn,
            mini_batch_size=mini_batch_size,
            **options,
        )
        pad = {"critic/zero_weight_pad_rows": float(split.pad_rows)} if split.pad_rows else {}
        return metrics[0] | pad

    # --- one-to-all: every rank joins the gather of its shards, rank 0 writes -------------------
    def save_pretrained(self, out_dir: str | Path) -> Path:
        return self.ranks.call_all("save", "save_pretrained", out_dir)[0]

    def stage_checkpoint(self, root: str | Path, step: int) -> Path:
        """The critic's part of checkpoint `step`, staged for the policy's atomic save."""
        return self.ranks.call_all("save", "stage_checkpoint", root, step)[0]

    def load_checkpoint(self, root: str | Path, step: int) -> None:
        """Every rank restores its shards from checkpoint `step` (rank 0 reads, then broadcasts)."""
        self.ranks.call_all("load", "load_checkpoint", root, step)

    # --- the group -------------------------------------------------------------------------------
    def controller_bytes(self) -> dict[str, float]:
        """Bytes the controller sent to and received from the critic's ranks since the last call
        (its TransferQueue reads and writes are the policy group's to count: one queue)."""
        return self.ranks.traffic.take()

    def arm_stack_dumps(self, folder: str | Path) -> list[str]:
        """Have every process of the group dump its stacks on request from now on (`RayRanks`)."""
        return self.ranks.arm_stack_dumps(folder)

    def dump_stacks(self, folder: str | Path, header: str) -> list[str]:
        """Every armed process's stacks into `folder`; a line per process for the hang report."""
        return self.ranks.dump_stacks(folder, header)

    def shutdown(self) -> None:
        self.ranks.stop()

    def __enter__(self) -> CriticWorkerGroup:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
