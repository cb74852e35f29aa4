"""Layer 3, orchestration: one data-parallel rank of the policy, in a process of its own (a Ray actor).

`PolicySpec` is what builds a policy worker (the keyword arguments of `PolicyWorker`), shared by
the in-process backend and this one. `PolicyRank` is a `PolicyWorker` whose actor and reference are
sharded with FSDP2 over a torch.distributed group (gloo on CPU, nccl on GPU); in the colocated plan
it also serves generation from its own full-weight copy. The inherited methods (generate,
compute_log_prob, compute_ref_log_prob, update_actor) run unchanged on this rank's share of rows,
handed over directly or read from the TransferQueue (`QueueReader.run_on_queue`).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stratarl.cluster.policy_worker import DTYPES, PolicyWorker, load_causal_lm, lora_reference_batching
from stratarl.cluster.queue_shard import QueueReader, generate_into_queue
from stratarl.cluster.rank_process import RankProcess
from stratarl.engine.actor import Actor, Reference
from stratarl.engine.data_parallel import DataParallel
from stratarl.engine.lora import apply_lora
from stratarl.rollout.interface import GenerationRequest, GenerationResult
from stratarl.rollout.torch_engine import TorchRolloutEngine
from stratarl.rollout.weight_sync import (
    DEFAULT_BUCKET_BYTES,
    WeightLoadReport,
    WeightSyncTarget,
    push_weights,
)
from stratarl.transport.data_proto import DataProto


@dataclass(frozen=True)
class PolicySpec:
    """The keyword arguments of `PolicyWorker`: one model directory, its actor settings and roles."""

    model_path: str
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    actor_kwargs: dict = field(default_factory=dict)
    reference_kwargs: dict | None = None
    lora: dict | None = None
    dtype: str = "float32"
    rollout_dtype: str = "float32"
    with_reference: bool = False
    rollout_seed: int = 0
    max_num_seqs: int = 256

    def worker_kwargs(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


class PolicyRank(PolicyWorker, QueueReader, RankProcess):
    """Rank `rank` of `world_size`, started by `rank_process.start_ranks`: the constructor sets this
    process's threads; `join` (on every rank at once) joins the group and calls `build`.

    with_rollout: serve generation here too (colocated plan); otherwise rollout replicas elsewhere
        receive the weights from rank 0 (`push_weights`).

    `PolicyWorker.__init__` is not run (its copies of the model must be taken before sharding here),
    but the same attributes are set (actor, reference, rollout, pad_token_id), so the inherited
    methods apply. A LoRA actor syncs its merged weights (not the adapter alone) from here.
    """

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        threads: int,
        spec: PolicySpec,
        with_rollout: bool,
        backend: str = "gloo",
        timeout_s: float = 600.0,
    ):
        self.set_up(rank=rank, world_size=world_size, threads=threads, backend=backend, timeout_s=timeout_s)
        self.spec, self.with_rollout = spec, with_rollout
        self.actor, self.reference, self.rollout = None, None, None
        self.pad_token_id = spec.pad_token_id

    def build(self, dp: DataParallel) -> None:
        """Load the model, then shard the actor (and reference) over the group."""
        spec = self.spec
        model = load_causal_lm(spec.model_path, spec.dtype)
        # Copies are taken before sharding: fully_shard turns the model's parameters into DTensors.
        if self.with_rollout:
            served = copy.deepcopy(model).to(DTYPES[spec.rollout_dtype]).eval().requires_grad_(False)
            self.rollout = TorchRolloutEngine(
                served,
                eos_token_ids=list(spec.eos_token_ids),
                pad_token_id=spec.pad_token_id,
                seed=spec.rollout_seed + self.rank,
                max_num_seqs=spec.max_num_seqs,
                replica_id=self.rank,
            )
        frozen = copy.deepcopy(model) if spec.with_reference and not spec.lora else None
        if spec.lora:  # {rank, alpha, target_modules}: only the adapters train
            model = apply_lora(model, **spec.lora)
        self.actor = Actor(model, **spec.actor_kwargs, data_parallel=dp)
        if spec.with_reference and spec.lora:  # the base under the adapter: no second copy
            self.reference = Reference.base_of(self.actor, **lora_reference_batching(spec.reference_kwargs))
        elif spec.with_reference:
            settings = {"micro_batch_size": self.actor.micro_batch_size} | (spec.reference_kwargs or {})
            self.reference = Reference(
                frozen, temperature=self.actor.temperature, data_parallel=dp, **settings
            )

    # --- generation (colocated plan) -------------------------------------------------------------
    def generate_requests(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        return self.rollout.generate(requests)

    def generate_into_queue(self, requests: Sequence[GenerationRequest], queue, meta, **layout) -> DataProto:
        """Generate, store every column in the TransferQueue, return the controller's columns."""
        return generate_into_queue(self.rollout, requests, queue, meta, **layout)

    def served_version(self) -> int:
        return self.rollout.weight_version

    # --- weights ---------------------------------------------------------------------------------
    def sync_weights(self, version: int | None = None) -> WeightLoadReport:
        """Colocated: rank 0 gathers the full weights (every rank joins the gather; LoRA merged) and
        hands them to the other ranks, then every rank's engine loads them as `version` (default +1)."""
        if self.rollout is None:
            raise RuntimeError(f"rank {self.rank} serves no generation: use push_weights to the replicas")
        state = self.actor.export_weights()  # full on rank 0, {} elsewhere
        if self.world_size > 1:
            state = self.actor.dp.broadcast_object(state)
        version = self.rollout.weight_version + 1 if version is None else version
        return self.rollout.load_weights(state, version)

    def push_weights(
        self, replicas: Sequence[WeightSyncTarget], *, version: int, bucket_bytes: int = DEFAULT_BUCKET_BYTES
    ) -> list[WeightLoadReport]:
        """Split plan: every rank joins the gather; rank 0 sends the weights to each rollout replica in
        buckets, directly (not through the controller), and checks each replica's version and checksum."""
        state = self.actor.export_weights()
        if self.rank != 0:
            return []
        return push_weights(state, replicas, version=version, bucket_bytes=bucket_bytes)

    def save_pretrained(self, out_dir: str | Path) -> Path:
        """The actor as an HF directory; a collective (the full weights are gathered), rank 0 writes."""
        return self.actor.save_hf(out_dir)
