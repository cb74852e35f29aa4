"""Layer 3, orchestration: the critic's worker group — `CriticWorker`'s methods over D data-parallel ranks.

The trainer holds a `CriticWorkerGroup` (a `handles.CriticHandle`) whatever the backend: one
in-process rank (`in_process`) or D Ray ranks of the critic's own (`ray_critic_group`). As in the
policy's group (`worker_group`), each method names its phase and the `CriticWorker` function the
ranks run, and `path` carries the rows: `dispatch.DirectDispatch` (padded scoring shares for
values, per-mini-batch update shares with zero-weight pad rows, gathered in row order) or, on Ray,
the policy group's own `QueueRows` over its TransferQueue: the ranks read their rows there and
write their values back, the controller sends references. Checkpoint calls are one-to-all: the
ranks gather their shards together.
"""

from __future__ import annotations

from pathlib import Path

from stratarl.cluster.critic_worker import CriticWorker
from stratarl.cluster.dispatch import DirectDispatch, RowPath
from stratarl.cluster.ranks import InProcessRanks, Ranks
from stratarl.cluster.specs import CriticSpec
from stratarl.cluster.worker_group import IN_PROCESS, SCORING_COLUMNS, Deployment, RankGroup, set_threads
from stratarl.engine.requests import UpdateRequest
from stratarl.engine.training import LossFn
from stratarl.transport.data_proto import DataProto


class CriticWorkerGroup(RankGroup):
    """The critic's ranks behind `CriticWorker`'s methods.

    ranks: `InProcessRanks` of `CriticWorker`s or `RayRanks` of rank processes each holding one.
    path: how the rows reach the ranks (`dispatch.RowPath`): `DirectDispatch` (the default: batches
        travel as DataProto) or, on Ray, the policy group's own `QueueRows` (one TransferQueue).
    deployment: what was started for the ranks, released with the group (None: nothing).
    """

    def __init__(
        self,
        ranks: Ranks,
        *,
        path: RowPath | None = None,
        deployment: Deployment | None = None,
    ):
        self.ranks = ranks
        self.path: RowPath = DirectDispatch() if path is None else path  # as in `PolicyWorkerGroup`
        self.deployment = deployment

    @classmethod
    def in_process(cls, spec: CriticSpec, *, threads: int | None = None) -> CriticWorkerGroup:
        """The embedded backend: one `CriticWorker` in this process."""
        set_threads(threads)
        return cls(InProcessRanks("critic", [CriticWorker(spec)]))

    @property
    def size(self) -> int:
        return self.ranks.size

    def placement(self) -> dict[str, list[str]]:
        """{"critic": where each rank runs: Ray node ids, or this process}."""
        if self.deployment is None:
            return {"critic": [IN_PROCESS] * self.size}
        return {"critic": list(self.deployment.nodes["critic"])}

    def local_worker(self) -> CriticWorker:
        """The `CriticWorker` of a one-rank in-process group, to look inside it (tests, notebooks)."""
        if not isinstance(self.ranks, InProcessRanks) or self.ranks.size != 1:
            raise RuntimeError(f"the critic's {self.size} rank(s) are not one worker in this process")
        return self.ranks.workers[0]

    def compute_values(self, batch: DataProto) -> DataProto:
        """[N, T] `values` of every row: each rank scores a balanced share (pad rows dropped after);
        through the queue, the ranks also store them there for the update to read."""
        return self.path.score(
            self.ranks, "critic.value", CriticWorker.compute_values, batch, SCORING_COLUMNS
        )

    def update_critic(self, batch: DataProto, loss_fn: LossFn, request: UpdateRequest) -> dict[str, float]:
        """Each rank updates on its share of every global mini-batch; rank 0's metrics (`_update_ranks`)."""
        return self._update_ranks("critic", CriticWorker.update_critic, batch, loss_fn, request)

    # --- one-to-all: every rank joins the gather of its shards, rank 0 writes -------------------
    def save_pretrained(self, out_dir: str | Path) -> Path:
        return self.ranks.call_all("save", CriticWorker.save_pretrained, out_dir)[0]

    def stage_checkpoint(self, root: str | Path, step: int) -> Path:
        """The critic's part of checkpoint `step`, staged for the policy's atomic save."""
        return self.ranks.call_all("save", CriticWorker.stage_checkpoint, root, step)[0]

    def load_checkpoint(self, root: str | Path, step: int) -> None:
        """Every rank restores its shards from checkpoint `step` (rank 0 reads, then broadcasts)."""
        self.ranks.call_all("load", CriticWorker.load_checkpoint, root, step)

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
