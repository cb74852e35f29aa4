"""Layer 3, orchestration: the engines that serve generation, as the controller sees them.

`RolloutReplicas` puts the rollout layer's `RolloutRouter` (sticky, least-loaded) over a role's
engines — the in-process worker's own engine, the colocated ranks' engines, or the replicas of a
rollout pool (`rollout_replica.RemoteReplica` handles) — and lays a batch's results out as the
trainer's batch edge, directly or through the TransferQueue. Given a way to start a replica again
(`replica_restart.ReplicaRestarter`) and rollout.max_replica_restarts, the router replaces a replica
lost mid-call and runs its share again (`rollout.replica_restarts`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stratarl.cluster.queue_rows import KEY, QueueRows
from stratarl.cluster.queue_shard import widen_integers
from stratarl.cluster.ranks import ControllerTraffic
from stratarl.observe.stack_dumps import ArmedProcess, dump_armed
from stratarl.rollout.batch_layout import results_to_batch
from stratarl.rollout.interface import GenerationRequest, GenerationResult, SamplingParams
from stratarl.rollout.replica_restarts import ReplicaRestart, ReplicaRestarts
from stratarl.rollout.router import Replica, RolloutRouter
from stratarl.transport.data_proto import DataProto
from stratarl.transport.kv_meta import KVBatchMeta


class RolloutReplicas:
    """A router over `replicas`. Replicas that are processes of their own (`RemoteReplica`) count
    the bytes they move and are stopped with the group; in-process engines do neither.

    start_again, max_restarts: a lost replica is replaced by start_again(lost) (a new one serving the
    others' weight version), at most max_restarts times in the run; None / 0: a loss is raised.
    """

    def __init__(
        self,
        replicas: Sequence[Replica],
        *,
        pad_token_id: int,
        start_again: Callable[[Any], Replica] | None = None,
        max_restarts: int = 0,
    ):
        restarts = ReplicaRestarts(max_restarts, self._start_again) if start_again is not None else None
        self.start_again = start_again
        self.router = RolloutRouter(replicas, restarts=restarts)
        self.pad_token_id = pad_token_id
        self.armed: list[ArmedProcess] = []  # replicas whose stacks can be dumped (arm_stack_dumps)
        self.armed_in: Path | None = None  # the folder they dump into, once armed
        self.last_calls: dict[int, dict[str, Any]] = {}  # replica id -> its last call (split plan)
        self.served_version = 0  # the version the last sync gave every replica (what a new one gets)
        for replica in self.targets:
            if getattr(replica, "calls", False) is None:  # a remote replica not sharing its ranks' record
                replica.calls = self.last_calls

    @property
    def targets(self) -> list[Replica]:
        """The replicas now serving (a restarted one in the place of the one it replaced)."""
        return self.router.replicas

    def _start_again(self, lost: Replica) -> Replica:
        assert self.start_again is not None
        new = self.start_again(lost)
        if self.armed_in is not None and hasattr(new, "arm_stack_dump"):  # the watchdog can dump it too
            self.armed = [p for p in self.armed if p.rank != new.replica_id]
            self.armed.append(new.arm_stack_dump(self.armed_in))
        return new

    def take_restarts(self) -> list[ReplicaRestart]:
        """The replicas restarted since the last call (none without restarts)."""
        return self.router.restarts.take() if self.router.restarts is not None else []

    @property
    def restarts_used(self) -> int:
        return self.router.restarts.used if self.router.restarts is not None else 0

    @property
    def weight_version(self) -> int:
        return self.router.weight_version  # raises when the replicas disagree

    def generate(self, prompts: DataProto, sampling: SamplingParams, *, seed: int | None = None) -> DataProto:
        """One response per row, row i seeded seed + i, in the batch-edge layout."""
        results = self.router.generate(generation_requests(prompts, sampling, seed))
        return results_proto(results, pad_token_id=self.pad_token_id, max_response_len=sampling.max_tokens)

    def generate_queued(
        self, prompts: DataProto, sampling: SamplingParams, rows: QueueRows, *, seed: int | None = None
    ) -> DataProto:
        """`generate` whose replicas write the rows into the TransferQueue: the bulk columns
        (`queue_shard.BULK_FIELDS`) stay there, listed in meta_info["queued_fields"]; the rest
        comes back with each row's `queue_key`. The widths are the whole batch's, as in one engine."""
        requests = generation_requests(prompts, sampling, seed)
        keys = rows.new_keys(len(requests))
        layout = {
            "pad_token_id": self.pad_token_id,
            "prompt_len": max(len(r.prompt_ids) for r in requests),
            "response_len": sampling.max_tokens,
        }

        def work(replica, share: list[GenerationRequest]) -> DataProto:
            meta = KVBatchMeta(rows.partition, [keys[int(r.request_id)] for r in share])
            return replica.generate_into_queue(share, rows.queue, meta, **layout)

        parts = self.router.run_shares(requests, work)
        order = np.argsort(np.concatenate([positions for positions, _ in parts]), kind="stable")
        # Each replica narrows its integer columns by the values of its own share (a column of 0s
        # and 1s travels as bool, one with a 2 as int32): widen each part before they meet.
        out = DataProto.concat([widen_integers(part) for _, part in parts]).take(order)
        rows.remember(keys, out)
        return out.union(DataProto.from_dict(non_tensors={KEY: np.array(keys, dtype=object)}))

    def arm_stack_dumps(self, folder: str | Path) -> list[str]:
        """Every replica that is a process of its own dumps its stacks on request from now on."""
        self.armed_in = Path(folder)
        self.armed = [r.arm_stack_dump(folder) for r in self.targets if hasattr(r, "arm_stack_dump")]
        return [f"{p.name}: pid {p.pid}" for p in self.armed]

    def dump_stacks(self, folder: str | Path, header: str) -> list[str]:
        # Imported here: ray_ranks imports ray, which a one-process run (a GPU check) need not have.
        from stratarl.cluster.ray_ranks import describe_calls

        return dump_armed(self.armed, folder, header, describe_calls(self.last_calls))

    def take_traffic(self) -> dict[str, float]:
        """Bytes sent to and received from remote replicas since the last call (0 for in-process ones)."""
        parts = [
            r.traffic.take()
            for r in self.targets
            if isinstance(getattr(r, "traffic", None), ControllerTraffic)
        ]
        return {key: sum(p[key] for p in parts) for key in ControllerTraffic().take()}


def generation_requests(
    prompts: DataProto, sampling: SamplingParams, seed: int | None
) -> list[GenerationRequest]:
    """One request per row of `prompts` (`raw_prompt_ids`); with a seed, row i samples with seed + i."""
    return [
        GenerationRequest(
            request_id=str(i),
            prompt_ids=list(ids),
            sampling=sampling if seed is None else dataclasses.replace(sampling, seed=seed + i),
        )
        for i, ids in enumerate(prompts["raw_prompt_ids"])
    ]


def results_proto(
    results: Sequence[GenerationResult], *, pad_token_id: int, max_response_len: int
) -> DataProto:
    """Results in the batch-edge layout: responses, masks, `rollout_log_probs`, `weight_version`,
    and `finish_reason`, `replica_id` (non-tensor)."""
    columns = results_to_batch(results, pad_token_id=pad_token_id, max_response_len=max_response_len)
    tensors = {k: v for k, v in columns.items() if isinstance(v, torch.Tensor)}
    provenance = {name: np.array(columns[name], dtype=object) for name in ("finish_reason", "replica_id")}
    return DataProto.from_dict(tensors, provenance)
