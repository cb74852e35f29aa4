"""Layer 3, orchestration: the policy's worker group — `PolicyWorker`'s methods over D data-parallel ranks.

The trainer holds one `PolicyWorkerGroup` (a `handles.PolicyHandle`) whatever the backend: one
in-process rank (`in_process`) or D Ray ranks (`ray_policy_group.start_policy_group`). Each method
names its phase and the `PolicyWorker` function every rank runs; the group's `path` carries the
rows: `dispatch.DirectDispatch` splits the batch over the ranks (padded, balanced), calls every rank
through its backend (`ranks`) and gathers the outputs in the original row order; `queue_rows.QueueRows`
(Ray) does the same with shard references, the rows staying in the TransferQueue. One-to-all calls
(weight sync, save) send the same arguments to every rank, because the ranks gather the sharded
weights together. How the weights reach the engines is the group's `rollout_sync`
(`rollout_sync.ColocatedSync`: every rank loads its own engine; `SplitSync`: with a rollout pool of
its own, generation goes to the replicas and training rank 0 pushes the weights to them).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch

from stratarl.cluster.dispatch import DirectDispatch, RowPath
from stratarl.cluster.policy_worker import PolicyWorker
from stratarl.cluster.queue_rows import MODEL_INPUTS
from stratarl.cluster.ranks import InProcessRanks, Method, Ranks
from stratarl.cluster.rollout_set import RolloutReplicas
from stratarl.cluster.rollout_sync import ColocatedSync, RolloutSync
from stratarl.cluster.specs import DEFAULT_TEACHER, PolicySpec
from stratarl.cluster.teacher_worker import TeacherWorker
from stratarl.engine.actor import LossFn
from stratarl.engine.checkpoint import LoadedCheckpoint
from stratarl.engine.requests import LOG_PROBS_ONLY, CheckpointRequest, ScoreRequest, UpdateRequest
from stratarl.rollout.interface import SamplingParams
from stratarl.rollout.replica_restarts import ReplicaRestart
from stratarl.rollout.router import RolloutRouter
from stratarl.rollout.weight_sync import WeightLoadReport, WeightSyncError
from stratarl.transport.data_proto import DataProto

# What a log-prob forward reads: only these columns travel to the ranks.
SCORING_COLUMNS = MODEL_INPUTS


class Deployment(Protocol):
    """What a group's processes were started with (Ray: the cluster connection, the reserved pools,
    the replica and storage actors), released when the group shuts down; `nodes`: role -> the node
    of each of its processes."""

    nodes: dict[str, list[str]]

    def stop(self) -> None: ...


class RankGroup:
    """What every worker group does alike with its ranks (`ranks`), the rows' path to them (`path`)
    and what was started for them (`deployment`): the update of a data-parallel role, and the end.
    A group is a context manager that ends with `shutdown`."""

    ranks: Ranks
    path: RowPath
    deployment: Deployment | None

    def _update_ranks(
        self, role: str, method: Method, batch: DataProto, loss_fn: LossFn, request: UpdateRequest
    ) -> dict[str, float]:
        """Each rank takes its share of every global mini-batch (`dispatch.split_for_update`); the
        ranks average their metrics among themselves, so rank 0's are the group's, with the count of
        the zero-weight rows that padded the split (`<role>/zero_weight_pad_rows`) when there were any."""
        metrics, split = self.path.update(self.ranks, f"{role}.update", method, batch, loss_fn, request)
        pad = {f"{role}/zero_weight_pad_rows": float(split.pad_rows)} if split.pad_rows else {}
        return metrics[0] | pad

    def shutdown(self) -> None:
        """Stop the ranks, then whatever was started for them (replicas, storage, pools, cluster)."""
        self.ranks.stop()
        if self.deployment is not None:
            self.deployment.stop()

    def __enter__(self: G) -> G:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


G = TypeVar("G", bound=RankGroup)

IN_PROCESS = "this process"  # where an in-process group's roles run (`placement`)


def set_threads(threads: int | None) -> None:
    """cluster.threads_per_worker in one process: the torch threads of this process (None: leave them)."""
    if threads is not None:
        torch.set_num_threads(threads)


class PolicyWorkerGroup(RankGroup):
    """The policy's ranks behind `PolicyWorker`'s methods.

    ranks: the ranks' backend (`InProcessRanks` of `PolicyWorker`s, or `RayRanks` of rank processes
        each holding one); rank r holds shard r.
    rollout: the engines that generate — the ranks' own (colocated) or a rollout pool's replicas.
    rollout_sync: how the weights reach the engines (`rollout_sync.RolloutSync`), chosen once:
        `ColocatedSync` (the default: every rank loads its own engine) or `SplitSync` (split plan:
        training rank 0 pushes to the replicas, which are processes of their own whose stacks the
        group dumps too).
    path: how the rows reach the ranks and engines (`dispatch.RowPath`), chosen once:
        `DirectDispatch` (the default: the rows travel in the calls) or `queue_rows.QueueRows` (Ray:
        each phase sends every rank a `QueueShard` reference, the bulk columns never reach the
        controller). Generation, scoring, updates and the queue's upkeep all go through it.
    deployment: the processes and resources behind the ranks, stopped with the group (None: none).
    """

    def __init__(
        self,
        ranks: Ranks,
        rollout: RolloutReplicas,
        *,
        rollout_sync: RolloutSync | None = None,
        path: RowPath | None = None,
        deployment: Deployment | None = None,
    ):
        self.ranks, self.engines = ranks, rollout
        self.rollout_sync: RolloutSync = ColocatedSync() if rollout_sync is None else rollout_sync
        self.path: RowPath = DirectDispatch() if path is None else path
        self.deployment = deployment
        self.teacher_ranks: Ranks | None = None  # a teacher pool of its own (`place_teacher`)

    @classmethod
    def in_process(cls, spec: PolicySpec, *, threads: int | None = None) -> PolicyWorkerGroup:
        """The embedded backend: one `PolicyWorker` in this process, generating with its own engine;
        `threads` sets this process's torch threads first (cluster.threads_per_worker)."""
        set_threads(threads)
        worker = PolicyWorker(spec)
        engines = RolloutReplicas([worker.rollout], pad_token_id=spec.pad_token_id)
        return cls(InProcessRanks("actor", [worker]), engines)

    @property
    def size(self) -> int:
        return self.ranks.size

    def placement(self) -> dict[str, list[str]]:
        """Role -> where each of its processes runs: Ray node ids (rank order), or this process."""
        if self.deployment is None:
            return {"actor": [IN_PROCESS] * self.size, "rollout": [IN_PROCESS] * len(self.engines.targets)}
        return dict(self.deployment.nodes)

    def local_worker(self) -> PolicyWorker:
        """The `PolicyWorker` of a one-rank in-process group, to look inside it (tests, notebooks)."""
        if not isinstance(self.ranks, InProcessRanks) or self.ranks.size != 1:
            raise RuntimeError(f"the policy's {self.size} rank(s) are not one worker in this process")
        return self.ranks.workers[0]

    # --- rollout -------------------------------------------------------------------------------
    def generate(self, prompts: DataProto, sampling: SamplingParams, *, seed: int | None = None) -> DataProto:
        """One response per row, row i seeded seed + i; the router keeps a prompt's n samples on one
        engine and balances the rest by load. With the TransferQueue the engines write the rows there."""
        return self.path.generate(self.engines, prompts, sampling, seed=seed)

    @property
    def rollout(self) -> RolloutRouter:
        """The generation engines as one `RolloutEngine` (what an agent loop drives)."""
        return self.engines.router

    def sync_weights(self, version: int | None = None) -> WeightLoadReport:
        """Actor -> rollout as `version` (default: version + 1). One-to-all: every rank joins the
        gather of the weights; every engine must then serve the same version."""
        reports = self.rollout_sync.sync(self.ranks, self.engines, version)
        if len({r.version for r in reports}) != 1:
            raise WeightSyncError(
                f"rollout engines report versions {[r.version for r in reports]} after a sync"
            )
        self.engines.served_version = reports[0].version  # what a restarted replica is given
        return reports[0]

    @property
    def weight_version(self) -> int:
        return self.engines.weight_version

    def take_replica_restarts(self) -> list[ReplicaRestart]:
        """Rollout replicas restarted since the last call (rollout.max_replica_restarts; none in one
        process or colocated), and how many restarts the run has used so far."""
        return self.engines.take_restarts()

    @property
    def replica_restarts_used(self) -> int:
        return self.engines.restarts_used

    # --- actor / reference -----------------------------------------------------------------------
    def compute_log_prob(self, batch: DataProto, request: ScoreRequest = LOG_PROBS_ONLY) -> DataProto:
        return self.path.score(
            self.ranks, "actor.log_prob", PolicyWorker.compute_log_prob, batch, SCORING_COLUMNS, request
        )

    def compute_ref_log_prob(self, batch: DataProto) -> DataProto:
        return self.path.score(
            self.ranks, "reference.log_prob", PolicyWorker.compute_ref_log_prob, batch, SCORING_COLUMNS
        )

    def compute_teacher_log_prob(self, batch: DataProto, teacher: str = DEFAULT_TEACHER) -> DataProto:
        """The rows scored by the distillation teacher named `teacher`: on the policy's ranks
        (`PolicyWorker.compute_teacher_log_prob`), or on the teacher's own process where the plan
        gives it a pool (`TeacherWorker.compute_teacher_log_prob`); both read only the model inputs."""
        if self.teacher_ranks is None:
            ranks, method = self.ranks, PolicyWorker.compute_teacher_log_prob
        else:
            ranks, method = self.teacher_ranks, TeacherWorker.compute_teacher_log_prob
        return self.path.score(ranks, "teacher.log_prob", method, batch, SCORING_COLUMNS, teacher)

    def place_teacher(self, ranks: Ranks) -> None:
        """Score the teacher phase on `ranks` (processes holding a `TeacherWorker`, on the plan's
        teacher pool) from now on; they stop with the group."""
        self.teacher_ranks = ranks

    def update_actor(self, batch: DataProto, loss_fn: LossFn, request: UpdateRequest) -> dict[str, float]:
        """Each rank updates on its share of every global mini-batch; rank 0's metrics (`_update_ranks`)."""
        return self._update_ranks("actor", PolicyWorker.update_actor, batch, loss_fn, request)

    def update_row_statistics(self) -> dict[str, torch.Tensor]:
        """The last update's per-row statistics from every rank, as one table keyed by `row_id`: each
        real row was trained on exactly one rank (pad rows are dropped by the engines)."""
        parts = [part for part in self.ranks.call_all("trace", PolicyWorker.update_row_statistics) if part]
        if not parts:
            return {}
        return {name: torch.cat([part[name] for part in parts]) for name in parts[0]}

    # --- one-to-all: every rank joins the gather of its shards, rank 0 writes -------------------
    def save_pretrained(self, out_dir: str | Path) -> Path:
        """The actor as an HF directory (LoRA merged)."""
        return self.ranks.call_all("save", PolicyWorker.save_pretrained, out_dir)[0]

    def save_checkpoint(self, root: str | Path, request: CheckpointRequest) -> Path:
        """root/global_step_{step}, atomically (`PolicyWorker.save_checkpoint`)."""
        return self.ranks.call_all("save", PolicyWorker.save_checkpoint, root, request)[0]

    def load_checkpoint(self, root: str | Path, *, step: int | None = None) -> LoadedCheckpoint | None:
        """Every rank restores its shards and RNG state; rank 0's result is returned."""
        return self.ranks.call_all("load", PolicyWorker.load_checkpoint, root, step=step)[0]

    # --- the TransferQueue path ------------------------------------------------------------------
    def materialize(self, batch: DataProto) -> DataProto:
        """A batch of this group with every column in it: the bulk columns the TransferQueue holds
        are read back (what a notebook or a one-process worker needs); as it is without a queue."""
        return self.path.materialize(batch)

    def clear_queue(self, through: int | None = None) -> int:
        """Drop the step's rows from the TransferQueue (verl's kv_clear at the end of a step): those
        collected for steps ≤ `through` and the unlabelled ones, or all (None); the rows dropped."""
        return self.path.clear(through)

    def queue_collection(self, step: int) -> contextlib.AbstractContextManager[None]:
        """Rows this thread writes to the TransferQueue in the block belong to step `step`'s batch."""
        return self.path.collecting(step)

    # --- the group -------------------------------------------------------------------------------
    def controller_bytes(self) -> dict[str, float]:
        """Bytes the controller sent to and received from other processes since the last call: the
        ranks' calls, the rollout's requests and results, and its own TransferQueue reads and
        writes (0 in one process); with the TransferQueue also `controller/queue_rows_held`, the rows
        still in it (after a step's clear: those of the batches collected ahead, none in sync mode)."""
        parts = [self.ranks.traffic.take(), self.engines.take_traffic(), self.path.take_traffic()]
        traffic = {key: sum(part[key] for part in parts) for key in parts[0]}
        return traffic | self.path.held_metrics()

    def arm_stack_dumps(self, folder: str | Path) -> list[str]:
        """Have every process of the group (ranks, the rollout replicas of a split plan, a teacher of
        its own) dump its stacks on request from now on (`RayRanks`, `RolloutReplicas`)."""
        lines = self.ranks.arm_stack_dumps(folder) + self.rollout_sync.arm_stack_dumps(self.engines, folder)
        return lines + (self.teacher_ranks.arm_stack_dumps(folder) if self.teacher_ranks else [])

    def dump_stacks(self, folder: str | Path, header: str) -> list[str]:
        """Every armed process's stacks into `folder`; a line per process for the hang report."""
        lines = self.ranks.dump_stacks(folder, header)
        lines += self.teacher_ranks.dump_stacks(folder, header) if self.teacher_ranks else []
        return lines + self.rollout_sync.dump_stacks(self.engines, folder, header)

    def shutdown(self) -> None:
        """Stop a teacher of its own, then the ranks and what was started for them (`RankGroup`)."""
        if self.teacher_ranks is not None:
            self.teacher_ranks.stop()
        super().shutdown()
