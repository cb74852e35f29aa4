"""Layer 3, orchestration: the colocated policy worker — actor, rollout engine and reference in one process.

A worker hosts roles; this one hosts the three that share the policy's weights, switching between
phases on the same device (verl's `ActorRolloutRefWorker`, as data rather than flags: the roles are
separate objects). It is built one way, from a `PolicySpec`: in this process (`distributed=False`,
the in-process backend) or on a Ray rank that has joined its role's process group
(`distributed=True`: the actor and reference are sharded with FSDP2 over it). The rank holds this
object and runs these same methods on its share of rows (`rank_process.RankProcess`).

Between phases the worker hands memory over, as verl's colocated mode does (`rollout.free_cache_engine`,
`actor.fsdp.optimizer_offload`): a training phase starts by releasing the rollout engine's KV cache,
and the optimizer state waits in CPU memory from the end of one update to the start of the next, so
generation has it. Both are no-ops on CPU, where one RAM serves both phases.

Weight sync is the same in both: the actor's full weights are gathered on rank 0 and handed to every
rank's engine; a LoRA actor sends its base weights and adapter the first time, then the adapter
alone (verl's adapter-only sync after `base_sync_done`). In one process the engine may instead serve
the actor's model itself (`RolloutEngineSpec.share_weights`, from `rollout.weight_sharing`): a sync
is then a version bump, `TorchRolloutEngine.serve_shared_weights`.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch

from stratarl.cluster.rollout_set import generation_requests, results_proto
from stratarl.cluster.specs import (
    DEFAULT_TEACHER,
    LoraSpec,
    ModelSpec,
    PolicySpec,
    PrecisionSpec,
    ReferenceSpec,
)
from stratarl.cluster.teacher_worker import TeacherWorker
from stratarl.engine.actor import Actor, LossFn, Reference
from stratarl.engine.checkpoint import CheckpointManager, LoadedCheckpoint
from stratarl.engine.data_parallel import DataParallel
from stratarl.engine.hf_models import load_causal_lm
from stratarl.engine.host_memory import use_host_allocator
from stratarl.engine.lora import AdapterUpdate, apply_lora, base_state, is_lora, strip_prefix
from stratarl.engine.perf import GIB
from stratarl.engine.requests import LOG_PROBS_ONLY, CheckpointRequest, ScoreRequest, UpdateRequest
from stratarl.rollout.factory import build_rollout_engine
from stratarl.rollout.interface import SamplingParams
from stratarl.rollout.weight_sync import (
    DEFAULT_BUCKET_BYTES,
    WeightLoadReport,
    WeightSyncTarget,
    push_weights,
)
from stratarl.transport.data_proto import DataProto

CHECKPOINT_ROLE = "actor"  # its directory in a checkpoint
Delivered = TypeVar("Delivered")  # what a weight delivery returns: one report, or one per replica


def data_parallel(precision: PrecisionSpec, *, distributed: bool) -> DataParallel:
    """The role's data parallelism: FSDP2 over the process group this process joined, or none."""
    settings = dict(
        param_dtype=precision.param_dtype,
        offload_params=precision.offload_params,
        reshard_after_forward=precision.reshard_after_forward,
    )
    return DataParallel.over_world(**settings) if distributed else DataParallel(**settings)


def lora_base_weights(actor: Actor) -> dict:
    """The frozen base weights under a LoRA actor, plain HF names: the first sync to the rollout."""
    return base_state(strip_prefix(actor.dp.full_model_state(actor.module), "lm."))


class PolicyWorker:
    """Actor + rollout engine (+ frozen reference) over one model directory.

    distributed: this process joined its role's process group; the actor and reference are sharded
        over it, and this rank's engine is replica `rank`.
    with_rollout: serve generation here (colocated); False when rollout replicas of their own serve
        it (split plan), which receive the weights from rank 0 (`push_weights`).
    """

    def __init__(self, spec: PolicySpec, *, distributed: bool = False, with_rollout: bool = True):
        self.spec = spec
        use_host_allocator(spec.model.host_allocator)  # before the first activations are allocated
        dp = data_parallel(spec.precision, distributed=distributed)
        model = load_causal_lm(spec.model)
        # Copies are taken before LoRA and sharding: peft injects adapters in place, and fully_shard
        # turns the model's parameters into DTensors. A shared engine serves `model` itself, which
        # neither may touch (config/rollout_weights.py; checked again here for specs built by hand).
        if spec.rollout.share_weights and (distributed or spec.lora is not None or not with_rollout):
            raise ValueError(
                "rollout.share_weights needs a colocated engine in one process over the whole model "
                f"(distributed={distributed}, lora={spec.lora is not None}, with_rollout={with_rollout})"
            )
        self.rollout = (
            build_rollout_engine(
                spec.rollout,
                spec.model,
                source_model=model,
                eos_token_ids=spec.eos_token_ids,
                pad_token_id=spec.pad_token_id,
                replica_id=dp.rank,
            )
            if with_rollout
            else None
        )
        frozen = reference_model(spec, model)
        if spec.lora is not None:  # only the adapters train
            model = apply_lora(model, **_lora_arguments(spec.lora))
        self.actor = build_actor(model, spec, dp)
        r = spec.reference
        self.reference = None if r is None else build_reference(frozen, self.actor, r, dp)
        self.teacher = None if spec.teacher is None else TeacherWorker(spec.teacher, dp)
        self._base_synced = False  # LoRA: the engine holds the base weights after the first sync
        # The colocated hand-off applies where generation and training share a GPU's memory.
        on_gpu = self.actor.device.type != "cpu"
        self.frees_rollout_cache = on_gpu and self.rollout is not None and spec.rollout.free_cache_engine
        self.offloads_optimizer = on_gpu and spec.precision.offload_optimizer
        self.released_bytes = 0  # KV cache freed since the last update (its metric)

    # --- the colocated memory hand-off -----------------------------------------------------------
    def release_rollout_cache(self) -> int:
        """Free the rollout engine's KV cache before a training phase (when the hand-off applies);
        the bytes released. Under CUDA the freed blocks go back to the driver too."""
        if not self.frees_rollout_cache:
            return 0
        released = self.rollout.release_memory()
        if released and torch.cuda.is_available():
            torch.cuda.empty_cache()
        self.released_bytes += released
        return released

    # --- rollout -------------------------------------------------------------------------------
    def generate(self, prompts: DataProto, sampling: SamplingParams, *, seed: int | None = None) -> DataProto:
        """One response per row of `prompts` (`raw_prompt_ids`, already repeated n times) from this
        worker's engine, in the batch-edge layout (docs/design.md#batch-conventions) with
        `rollout_log_probs` and `weight_version`; row i samples with seed + i. (A worker group routes
        over its engines.)"""
        results = self._engine().generate(generation_requests(prompts, sampling, seed))
        return results_proto(
            results, pad_token_id=self.spec.pad_token_id, max_response_len=sampling.max_tokens
        )

    def sync_weights(self, version: int | None = None) -> WeightLoadReport:
        """Actor -> this worker's engine as `version` (default: version + 1), checked on arrival. A
        collective with ranks: every rank joins the gather, rank 0 hands the weights to the others."""
        engine, dp = self._engine(), self.actor.dp
        version = engine.weight_version + 1 if version is None else version  # a resume sets it
        if self.spec.rollout.share_weights:  # the engine serves the actor's model: nothing to copy
            return engine.serve_shared_weights(self.actor.model, version)

        def full(state: dict) -> WeightLoadReport:
            return engine.load_weights(dp.broadcast_object(state), version)

        def lora(base: dict | None, adapter: AdapterUpdate) -> WeightLoadReport:
            base, adapter = dp.broadcast_object((base, adapter))
            return engine.load_adapter(adapter, version, base=base)

        return self._send_weights(full, lora)

    def push_weights(
        self,
        replicas: Sequence[WeightSyncTarget],
        *,
        version: int,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        fresh: bool = False,
    ) -> list[WeightLoadReport]:
        """Split plan: every rank joins the gather; rank 0 sends the weights to each rollout replica,
        directly (not through the controller): the full weights in buckets, checked by version and
        checksum; for a LoRA actor the base weights and adapter the first time, then the adapter.
        fresh: the replicas are new (a restarted replica): a LoRA actor sends its base weights again."""
        sends = self.actor.dp.rank == 0

        def full(state: dict) -> list[WeightLoadReport]:
            return push_weights(state, replicas, version=version, bucket_bytes=bucket_bytes) if sends else []

        def lora(base: dict | None, adapter: AdapterUpdate) -> list[WeightLoadReport]:
            return [r.load_adapter(adapter, version, base=base) for r in replicas] if sends else []

        return self._send_weights(full, lora, fresh=fresh)

    def _send_weights(
        self,
        full: Callable[[dict], Delivered],
        lora: Callable[[dict | None, AdapterUpdate], Delivered],
        *,
        fresh: bool = False,
    ) -> Delivered:
        """The actor's weights out, through `full` (the full weights, LoRA merged) or, for a LoRA actor,
        `lora`: the base weights and the adapter the first time, then the adapter alone (base None;
        verl's adapter-only sync after `base_sync_done`). A collective: every rank gathers, rank 0
        holds the tensors (the others empty ones), and the delivery decides who sends."""
        if not is_lora(self.actor.model):
            return full(self.actor.export_weights())
        base = None if self._base_synced and not fresh else lora_base_weights(self.actor)
        delivered = lora(base, self.actor.export_adapter())
        self._base_synced = True  # the engines hold the base weights from now on
        return delivered

    @property
    def weight_version(self) -> int:
        return self._engine().weight_version

    def _engine(self):
        if self.rollout is None:
            raise RuntimeError("this policy worker serves no generation (split plan): its replicas do")
        return self.rollout

    # --- actor / reference ---------------------------------------------------------------------
    def compute_log_prob(self, batch: DataProto, request: ScoreRequest = LOG_PROBS_ONLY) -> DataProto:
        """`old_log_probs` (+ `entropys`, + `sum_pi_squared` for the OTB estimators), one forward."""
        self.release_rollout_cache()
        out = self.actor.score_responses(batch, request)
        names = {"log_prob": "old_log_probs", "entropy": "entropys", "sum_pi_squared": "sum_pi_squared"}
        return DataProto.from_dict({names[name]: column for name, column in out.items()})

    def compute_ref_log_prob(self, batch: DataProto) -> DataProto:
        if self.reference is None:
            raise RuntimeError("this worker was built without a reference model (PolicySpec.reference=None)")
        self.release_rollout_cache()
        return DataProto.from_dict({"ref_log_prob": self.reference.compute_log_prob(batch)})

    def compute_teacher_log_prob(self, batch: DataProto, teacher: str = DEFAULT_TEACHER) -> DataProto:
        """The distillation teacher `teacher`'s columns of the rows (`TeacherWorker`), inside the
        colocated hand-off like every scoring forward."""
        if self.teacher is None:
            raise RuntimeError("this worker was built without teachers (PolicySpec.teacher=None)")
        self.release_rollout_cache()
        return self.teacher.compute_teacher_log_prob(batch, teacher)

    def update_actor(self, batch: DataProto, loss_fn: LossFn, request: UpdateRequest) -> dict[str, float]:
        """One actor update, inside the hand-off: the rollout's KV cache released first, the optimizer
        state brought back from CPU memory for the update and sent there again after it."""
        self.release_rollout_cache()
        if self.offloads_optimizer:
            self.actor.reload_optimizer()
        metrics = self.actor.update(batch, loss_fn, request)
        if self.actor.device.type != "cpu":  # spent: generation gets their memory (4 bytes a parameter)
            self.actor.free_gradients()
        if self.frees_rollout_cache:  # at this step's first training phase, usually the old log-prob
            metrics["perf/rollout_cache_released_gb"] = self.released_bytes / GIB
            self.released_bytes = 0
        if self.offloads_optimizer:
            metrics["perf/optimizer_offloaded_gb"] = self.actor.offload_optimizer() / GIB
            torch.cuda.empty_cache()
        return metrics

    def update_row_statistics(self) -> dict[str, torch.Tensor]:
        """The last actor update's per-row statistics (`row_id` [R], new log-prob, ratio, clipped
        share, …; `engine.training`): {} unless that update's batch carried `row_id`."""
        return dict(self.actor.last_row_statistics)

    # --- checkpoints (collectives with ranks: every rank joins, rank 0 writes) -------------------
    def save_checkpoint(self, root: str | Path, request: CheckpointRequest) -> Path:
        """root/global_step_{step}: the actor, RNG, the HF export and the trainer's state, atomically
        (`engine.checkpoint`), with the roles `request` names as staged for this step."""
        manager = CheckpointManager(root, dp=self.actor.dp)
        with self._optimizer_on_device():  # gathered where the parameters are (nccl moves no CPU shards)
            return manager.save(
                request.step,
                {CHECKPOINT_ROLE: self.actor},
                hf_policy=self.actor,
                tokenizer=request.tokenizer,
                trainer_state=request.trainer_state,
                staged=request.staged_roles,
            )

    def load_checkpoint(self, root: str | Path, *, step: int | None = None) -> LoadedCheckpoint | None:
        """Restore the newest complete checkpoint under root (or `step`) into the actor and the RNG
        states; None when there is none."""
        with self._optimizer_on_device():
            return CheckpointManager(root, dp=self.actor.dp).load({CHECKPOINT_ROLE: self.actor}, step=step)

    @contextlib.contextmanager
    def _optimizer_on_device(self) -> Iterator[None]:
        """Under optimizer offload: the state beside the parameters for the block, in CPU memory after."""
        if self.offloads_optimizer:
            self.actor.reload_optimizer()
        try:
            yield
        finally:
            if self.offloads_optimizer:
                self.actor.offload_optimizer()

    def save_pretrained(self, out_dir: str | Path) -> Path:
        """The actor's weights as an HF directory (loadable with `from_pretrained`; LoRA merged)."""
        return self.actor.save_hf(out_dir)


def build_actor(model, spec: PolicySpec, dp: DataParallel) -> Actor:
    a = spec.actor
    return Actor(
        model,
        optim=a.optimizer,
        micro_batch_size=a.batching.micro_batch_size,
        max_tokens_per_micro_batch=a.batching.max_tokens_per_micro_batch,
        layout=a.batching.layout,
        logit_chunk_size=a.logit_chunk_size,
        temperature=a.temperature,
        gradient_checkpointing=spec.model.gradient_checkpointing,
        data_parallel=dp,
    )


def reference_model(spec: PolicySpec, start):
    """The reference's own model: reference.model_path's (same vocabulary as the actor's), else a
    frozen copy of the actor's start `start`; None under LoRA without a path (the base scores) or
    without a reference."""
    r = spec.reference
    if r is None:
        return None
    if r.model is None:
        return copy.deepcopy(start) if spec.lora is None else None
    return frozen_model(r.model, start, "reference.model_path")


def frozen_model(model: ModelSpec, start, key: str):
    """The model of a frozen scorer (`key` names its setting), refused unless its vocabulary is the
    actor's: it scores the actor's token ids."""
    frozen = load_causal_lm(model)
    ours, theirs = (
        start.get_output_embeddings().weight.shape[0],
        frozen.get_output_embeddings().weight.shape[0],
    )
    if ours != theirs:
        raise ValueError(
            f"{key}={model.path}: its vocabulary has {theirs} entries, the actor's "
            f"{ours}; it scores the actor's token ids, so both need the same tokenizer"
        )
    return frozen


def build_reference(frozen, actor: Actor, r: ReferenceSpec, dp: DataParallel) -> Reference:
    """`frozen` (`reference_model`, `frozen_model`) as a frozen scorer (the reference or a teacher), or
    under LoRA without a reference model of its own the base under the actor's adapter (no copy)."""
    batching = dict(
        micro_batch_size=r.batching.micro_batch_size,
        max_tokens_per_micro_batch=r.batching.max_tokens_per_micro_batch,
        layout=r.batching.layout,
    )
    if frozen is None:  # LoRA: the actor's base with the adapter off
        return Reference.base_of(actor, **batching)
    return Reference(
        frozen,
        temperature=actor.temperature,
        logit_chunk_size=r.logit_chunk_size,
        data_parallel=dp,
        **batching,
    )


def _lora_arguments(lora: LoraSpec) -> dict[str, Any]:
    targets = lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules)
    return {"rank": lora.rank, "alpha": lora.alpha, "target_modules": targets}
