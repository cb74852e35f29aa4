"""Layer 3, orchestration: rollout replicas in processes of their own (the split plan).

`RolloutReplica` is the process: a `TorchRolloutEngine` over the model directory, run as a Ray
actor of the rollout pool. `RemoteReplica` is its handle with the engine's methods, so the
rollout layer's `RolloutRouter` (sticky, least-loaded) spreads requests over replicas, and
`push_weights` on training rank 0 sends them buckets, both without knowing Ray is there. Every
remote call waits at most `timeout_s`; a replica that dies or hangs raises `WorkerError`.
`RolloutReplicas` is the set the controller holds: generate a batch, read the served version.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
import transformers
from torch import Tensor

from stratarl.cluster.policy_worker import load_causal_lm
from stratarl.cluster.queue_rows import KEY, QueueRows
from stratarl.cluster.queue_shard import generate_into_queue, widen_integers
from stratarl.cluster.ranks import (
    ControllerTraffic,
    WorkerError,
    describe_calls,
    error_summary,
    record_answer,
    record_call,
    wire_bytes,
)
from stratarl.observe.stack_dumps import ArmedProcess, arm_stack_dumps, dump_armed
from stratarl.rollout.batch_layout import results_to_batch
from stratarl.rollout.interface import GenerationRequest, GenerationResult, SamplingParams
from stratarl.rollout.router import Replica, RolloutRouter
from stratarl.rollout.torch_engine import TorchRolloutEngine
from stratarl.rollout.weight_sync import TensorSlice, WeightLoadReport
from stratarl.transport.data_proto import DataProto
from stratarl.transport.kv_meta import KVBatchMeta
from stratarl.transport.transfer_queue import TransferQueue


class RolloutReplica:
    """A rollout engine in its own process, serving the model directory's weights as version 0."""

    def __init__(
        self,
        *,
        replica_id: int,
        threads: int,
        model_path: str,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        dtype: str = "float32",
        seed: int = 0,
        max_num_seqs: int = 256,
    ):
        transformers.logging.disable_progress_bar()  # no per-process load bars in the driver log
        torch.set_num_threads(threads)
        self.replica_id = replica_id
        model = load_causal_lm(model_path, dtype).eval().requires_grad_(False)
        self.engine = TorchRolloutEngine(
            model,
            eos_token_ids=list(eos_token_ids),
            pad_token_id=pad_token_id,
            seed=seed + replica_id,
            max_num_seqs=max_num_seqs,
            replica_id=replica_id,
        )

    def generate_requests(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        return self.engine.generate(requests)

    def generate_into_queue(self, requests: Sequence[GenerationRequest], queue, meta, **layout) -> DataProto:
        """Generate, store every column in the TransferQueue, return the controller's columns."""
        return generate_into_queue(self.engine, requests, queue, meta, **layout)

    def served_version(self) -> int:
        return self.engine.weight_version

    def register_stack_dump(self, folder: str, role: str) -> dict[str, object]:
        """faulthandler on SIGUSR1 from now on: this replica's stacks into `folder` (`stack_dumps`)."""
        return arm_stack_dumps(folder, role, self.replica_id)

    def check_weights(self, shapes: Mapping[str, Tensor]) -> None:
        self.engine.check_weights(shapes)

    def begin_weight_update(self, version: int, *, partial: bool = False) -> None:
        self.engine.begin_weight_update(version, partial=partial)

    def receive_weights(self, bucket: Sequence[TensorSlice]) -> None:
        self.engine.receive_weights(bucket)

    def finish_weight_update(self) -> WeightLoadReport:
        return self.engine.finish_weight_update()


class RemoteReplica:
    """An actor that serves generation (a `RolloutReplica`, or a colocated `PolicyRank`) behind the
    methods of an engine (`Replica`, `WeightSyncTarget`)."""

    def __init__(
        self,
        actor: Any,
        replica_id: int,
        *,
        timeout_s: float,
        calls: dict | None = None,
        on_failure: Callable[..., Any] | None = None,
    ):
        self.actor, self.replica_id, self.timeout_s = actor, replica_id, timeout_s
        self.on_failure = on_failure  # (WorkerError, dump=bool): e.g. the colocated ranks' report
        self.traffic = ControllerTraffic()  # what passed through the process holding this handle
        # The last call of each process (shared with its ranks' `RayRanks.last_calls` when colocated).
        self.calls: dict[int, dict[str, Any]] | None = calls  # None: set by `RolloutReplicas`

    def _get(self, phase: str, ref: ray.ObjectRef) -> Any:
        hung = False
        try:
            return ray.get(ref, timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            why, hung = f"did not answer within {self.timeout_s:g} s (hung or still busy)", True
        except ray.exceptions.RayActorError as error:
            why = f"died ({error_summary(error)})"
        error = WorkerError("rollout", phase, {self.replica_id: why})
        if self.on_failure is not None:  # a hang report (with the processes' stacks when it hung)
            self.on_failure(error, dump=hung)
        raise error

    @property
    def weight_version(self) -> int:
        return self._get("weight_version", self.actor.served_version.remote())

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        self.traffic.sent += wire_bytes(list(requests))
        record_call(self.calls, self.replica_id, "rollout.generate", "generate_requests", [list(requests)])
        results = self._get("rollout.generate", self.actor.generate_requests.remote(list(requests)))
        record_answer(self.calls, self.replica_id)
        self.traffic.received += wire_bytes(results)
        return results

    def generate_into_queue(
        self, requests: Sequence[GenerationRequest], queue: TransferQueue, meta: KVBatchMeta, **layout: int
    ) -> DataProto:
        """The replica writes the layout of its requests' results into `queue` under `meta`'s keys;
        only the controller's columns come back (`queue_shard.generate_into_queue`)."""
        call = (list(requests), queue, meta, layout)
        self.traffic.sent += wire_bytes(call)
        record_call(self.calls, self.replica_id, "rollout.generate", "generate_into_queue", [list(requests)])
        out = self._get("rollout.generate", self.actor.generate_into_queue.remote(*call[:3], **layout))
        record_answer(self.calls, self.replica_id)
        self.traffic.received += wire_bytes(out)
        return out

    async def generate_async(self, request: GenerationRequest) -> GenerationResult:
        self.traffic.sent += wire_bytes([request])
        (result,) = await self.actor.generate_requests.remote([request])
        self.traffic.received += wire_bytes([result])
        return result

    def check_weights(self, state_dict: Mapping[str, Tensor]) -> None:
        # Keys and shapes only: meta tensors carry no data, so the check sends no weights.
        shapes = {name: torch.empty(t.shape, device="meta") for name, t in state_dict.items()}
        self._get("weight_sync", self.actor.check_weights.remote(shapes))

    def begin_weight_update(self, version: int, *, partial: bool = False) -> None:
        self._get("weight_sync", self.actor.begin_weight_update.remote(version, partial=partial))

    def receive_weights(self, bucket: Sequence[TensorSlice]) -> None:
        self._get("weight_sync", self.actor.receive_weights.remote(list(bucket)))

    def finish_weight_update(self) -> WeightLoadReport:
        return self._get("weight_sync", self.actor.finish_weight_update.remote())


class RolloutReplicas:
    """The engines that serve generation, as the controller sees them: a router over them (in-process
    engines, colocated ranks or the replicas of a rollout pool)."""

    def __init__(self, replicas: Sequence[Replica], *, pad_token_id: int):
        self.targets = list(replicas)
        self.router = RolloutRouter(self.targets)
        self.armed: list[ArmedProcess] = []  # replicas whose stacks can be dumped (arm_stack_dumps)
        self.last_calls: dict[int, dict[str, Any]] = {}  # replica id -> its last call (split plan)
        for replica in self.targets:
            if isinstance(replica, RemoteReplica) and replica.calls is None:
                replica.calls = self.last_calls
        self.pad_token_id = pad_token_id

    @property
    def weight_version(self) -> int:
        return self.router.weight_version  # raises when the replicas disagree

    def generate(self, prompts: DataProto, sampling: SamplingParams, *, seed: int | None = None) -> DataProto:
        """`PolicyWorker.generate` over the replicas: one response per row, row i seeded seed + i."""
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

        def work(replica: RemoteReplica, share: list[GenerationRequest]) -> DataProto:
            meta = KVBatchMeta(rows.partition, [keys[int(r.request_id)] for r in share])
            return replica.generate_into_queue(share, rows.queue, meta, **layout)

        parts = self.router.run_shares(requests, work)
        order = np.argsort(np.concatenate([positions for positions, _ in parts]), kind="stable")
        out = widen_integers(DataProto.concat([part for _, part in parts]).take(order))
        rows.remember(keys, out)
        return out.union(DataProto.from_dict(non_tensors={KEY: np.array(keys, dtype=object)}))

    def arm_stack_dumps(self, folder: str | Path) -> list[str]:
        """Every replica that is a process of its own dumps its stacks on request from now on."""
        remote = [r for r in self.targets if isinstance(r, RemoteReplica)]
        armed = ray.get(
            [r.actor.register_stack_dump.remote(str(Path(folder) / "ranks"), "rollout") for r in remote]
        )
        self.armed = [
            ArmedProcess("rollout", r.replica_id, int(a["pid"]), str(a["path"]))
            for r, a in zip(remote, armed, strict=True)
        ]
        return [f"{p.name}: pid {p.pid}" for p in self.armed]

    def dump_stacks(self, folder: str | Path, header: str) -> list[str]:
        return dump_armed(self.armed, folder, header, describe_calls(self.last_calls))

    def take_traffic(self) -> dict[str, float]:
        """Bytes sent to and received from remote replicas since the last call (0 for in-process ones)."""
        parts = [r.traffic.take() for r in self.targets if isinstance(r, RemoteReplica)]
        return {key: sum(p[key] for p in parts) for key in ControllerTraffic().take()}

    def stop(self) -> None:
        """Kill the replicas that are actors of their own."""
        for replica in self.targets:
            if isinstance(replica, RemoteReplica):
                ray.kill(replica.actor, no_restart=True)


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
    """Results in the batch-edge layout, as `PolicyWorker.generate` returns them."""
    columns = results_to_batch(results, pad_token_id=pad_token_id, max_response_len=max_response_len)
    tensors = {k: v for k, v in columns.items() if isinstance(v, torch.Tensor)}
    provenance = {name: np.array(columns[name], dtype=object) for name in ("finish_reason", "replica_id")}
    return DataProto.from_dict(tensors, provenance)
