"""Layer 3, orchestration: rollout engines in processes of their own, and the controller's handle on them.

`RolloutReplica` is the worker of a rollout pool's process (the split plan): the engine
`rollout.backend` names, built by the rollout factory like the colocated worker's. `RemoteReplica`
is a handle with the engine's methods on any process that serves generation — a rollout replica, or
a colocated policy rank (both hold their engine as `worker.rollout`) — so the rollout layer's
`RolloutRouter` spreads requests over them and `push_weights` on training rank 0 sends them buckets,
both without knowing Ray is there. Every remote call waits at most `timeout_s`; a replica that dies
or hangs raises `RolloutReplicaError`, a `WorkerError` that the router's restarts
(rollout.max_replica_restarts, `replica_restart`) know as a lost replica (`ReplicaLost`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import ray
import torch
from torch import Tensor

from stratarl.cluster.queue_shard import generate_into_queue
from stratarl.cluster.ranks import ControllerTraffic, WorkerError
from stratarl.cluster.ray_ranks import (
    error_summary,
    record_answer,
    record_call,
    register_stack_dump,
    wire_bytes,
)
from stratarl.cluster.specs import PolicySpec
from stratarl.engine.lora import AdapterUpdate
from stratarl.observe.stack_dumps import ArmedProcess
from stratarl.rollout.factory import build_rollout_engine
from stratarl.rollout.interface import GenerationRequest, GenerationResult
from stratarl.rollout.replica_restarts import ReplicaLost
from stratarl.rollout.weight_sync import TensorSlice, WeightLoadReport
from stratarl.transport.data_proto import DataProto
from stratarl.transport.kv_meta import KVBatchMeta
from stratarl.transport.transfer_queue import TransferQueue


class RolloutReplicaError(WorkerError, ReplicaLost):
    """Rollout replica `replica_id` died or did not answer in phase `phase` (cause: died / timed out)."""

    def __init__(self, phase: str, replica_id: int, cause: str, why: str):
        WorkerError.__init__(self, "rollout", phase, {replica_id: why})
        self.replica_id, self.cause, self.why = replica_id, cause, why

    def after_restarts(self, used: int, limit: int) -> RolloutReplicaError:
        used_up = f"{self.why}; {used} of {limit} restarts (rollout.max_replica_restarts) used"
        return RolloutReplicaError(self.phase, self.replica_id, self.cause, used_up)


class RolloutReplica:
    """Replica `replica_id` of the policy's rollout engine, serving the model directory as version 0."""

    def __init__(self, spec: PolicySpec, *, replica_id: int):
        self.rollout = build_rollout_engine(
            spec.rollout,
            spec.model,
            eos_token_ids=spec.eos_token_ids,
            pad_token_id=spec.pad_token_id,
            replica_id=replica_id,
        )


# What a remote call runs on the worker of a process that serves generation (`RankProcess.run`).
def _generate(worker: Any, requests: list[GenerationRequest]) -> list[GenerationResult]:
    return worker.rollout.generate(requests)


def _generate_into_queue(worker: Any, requests, queue, meta, **layout) -> DataProto:
    return generate_into_queue(worker.rollout, requests, queue, meta, **layout)


def _served_version(worker: Any) -> int:
    return worker.rollout.weight_version


def _check_weights(worker: Any, shapes: Mapping[str, Tensor]) -> None:
    worker.rollout.check_weights(shapes)


def _begin_weight_update(worker: Any, version: int, partial: bool) -> None:
    worker.rollout.begin_weight_update(version, partial=partial)


def _receive_weights(worker: Any, bucket: list[TensorSlice]) -> None:
    worker.rollout.receive_weights(bucket)


def _finish_weight_update(worker: Any) -> WeightLoadReport:
    return worker.rollout.finish_weight_update()


def _load_adapter(worker: Any, update: AdapterUpdate, version: int, base) -> WeightLoadReport:
    return worker.rollout.load_adapter(update, version, base=base)


class RemoteReplica:
    """A process that serves generation (its `RankProcess` actor) behind the methods of an engine
    (`Replica`, `WeightSyncTarget`).

    calls: where this replica's last call is remembered for hang reports (a colocated rank shares its
        ranks' `RayRanks.last_calls`; `RolloutReplicas` gives the replicas of a split plan theirs).
    on_failure: called as on_failure(error, dump=hung) before a failed call raises (the colocated
        ranks' `RayRanks.record_failure`: a report, and the processes' stacks when it hung)."""

    def __init__(
        self,
        actor: Any,
        replica_id: int,
        *,
        timeout_s: float,
        calls: dict[int, dict[str, Any]] | None = None,
        on_failure: Callable[..., Any] | None = None,
    ):
        self.actor, self.replica_id, self.timeout_s = actor, replica_id, timeout_s
        self.calls, self.on_failure = calls, on_failure
        self.traffic = ControllerTraffic()  # what passed through the process holding this handle

    def _call(self, phase: str, method, *args: Any, **kwargs: Any) -> Any:
        record_call(self.calls, self.replica_id, phase, method.__name__.lstrip("_"), args)
        hung = False
        try:
            result = ray.get(self.actor.run.remote(method, *args, **kwargs), timeout=self.timeout_s)
            record_answer(self.calls, self.replica_id)
            return result
        except ray.exceptions.GetTimeoutError:
            why = f"did not answer within {self.timeout_s:g} s (hung or still busy)"
            cause, hung = "timed out", True
        except ray.exceptions.RayActorError as error:
            cause, why = "died", f"died ({error_summary(error)})"
        error = RolloutReplicaError(phase, self.replica_id, cause, why)
        if self.on_failure is not None:
            self.on_failure(error, dump=hung)
        raise error

    def arm_stack_dump(self, folder: str | Path) -> ArmedProcess:
        """faulthandler on SIGUSR1 in this replica's process from now on, into folder/ranks/."""
        armed = ray.get(
            self.actor.__ray_call__.remote(register_stack_dump, str(Path(folder) / "ranks"), "rollout"),
            timeout=self.timeout_s,
        )
        return ArmedProcess("rollout", self.replica_id, int(armed["pid"]), str(armed["path"]))

    @property
    def weight_version(self) -> int:
        return self._call("weight_version", _served_version)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        self.traffic.sent += wire_bytes(list(requests))
        results = self._call("rollout.generate", _generate, list(requests))
        self.traffic.received += wire_bytes(results)
        return results

    def generate_into_queue(
        self, requests: Sequence[GenerationRequest], queue: TransferQueue, meta: KVBatchMeta, **layout: int
    ) -> DataProto:
        """The replica writes the layout of its requests' results into `queue` under `meta`'s keys;
        only the controller's columns come back (`queue_shard.generate_into_queue`)."""
        call = (list(requests), queue, meta, layout)
        self.traffic.sent += wire_bytes(call)
        out = self._call("rollout.generate", _generate_into_queue, *call[:3], **layout)
        self.traffic.received += wire_bytes(out)
        return out

    async def generate_async(self, request: GenerationRequest) -> GenerationResult:
        self.traffic.sent += wire_bytes([request])
        try:
            (result,) = await self.actor.run.remote(_generate, [request])
        except ray.exceptions.RayActorError as error:
            raise RolloutReplicaError(
                "rollout.generate", self.replica_id, "died", f"died ({error_summary(error)})"
            ) from None
        self.traffic.received += wire_bytes([result])
        return result

    def check_weights(self, state_dict: Mapping[str, Tensor]) -> None:
        # Keys and shapes only: meta tensors carry no data, so the check sends no weights.
        shapes = {name: torch.empty(t.shape, device="meta") for name, t in state_dict.items()}
        self._call("weight_sync", _check_weights, shapes)

    def begin_weight_update(self, version: int, *, partial: bool = False) -> None:
        self._call("weight_sync", _begin_weight_update, version, partial)

    def receive_weights(self, bucket: Sequence[TensorSlice]) -> None:
        self._call("weight_sync", _receive_weights, list(bucket))

    def finish_weight_update(self) -> WeightLoadReport:
        return self._call("weight_sync", _finish_weight_update)

    def load_adapter(
        self, update: AdapterUpdate, version: int, *, base: Mapping[str, Tensor] | None = None
    ) -> WeightLoadReport:
        """A LoRA sync (`TorchRolloutEngine.load_adapter`): the base weights the first time, then A and B."""
        return self._call("weight_sync", _load_adapter, update, version, None if base is None else dict(base))
