"""Assembly: the trained roles from the config — typed specs, then their worker groups.

Config stops here (docs/design.md#config-stops-at-the-boundary): the policy and the critic are
built from `cluster.specs` (one spec per role: the same worker in this process and on every Ray
rank), and the Ray placement plan from `cluster.*`; everything below receives those specs or plain
keyword arguments, never a `RunConfig`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from transformers import AutoConfig

from stratarl.algo.distillation import get_distillation_loss
from stratarl.assembly.datasets import eos_token_ids
from stratarl.cluster.critic_group import CriticWorkerGroup
from stratarl.cluster.placement import PlacementPlan, WorkerSizes, make_plan
from stratarl.cluster.specs import (
    DEFAULT_TEACHER,
    ActorSpec,
    BatchingSpec,
    CriticSpec,
    LoraSpec,
    ModelSpec,
    OptimizerSettings,
    PolicySpec,
    PrecisionSpec,
    ReferenceSpec,
    RolloutEngineSpec,
    TeacherSpec,
)
from stratarl.cluster.worker_group import PolicyWorkerGroup
from stratarl.config import RunConfig
from stratarl.config.rollout_weights import sharing_blockers


def resolve_device(cfg: RunConfig) -> str:
    """cluster.device with auto resolved: cuda when this process sees CUDA (in-process) or when the
    training workers reserve GPUs (ray); cpu otherwise. (Validation refuses cuda without CUDA.)"""
    c = cfg.cluster
    if c.device != "auto":
        return c.device
    if c.backend == "ray":
        return "cuda" if c.gpus_per_training_worker > 0 else "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def model_spec(cfg: RunConfig, path: str) -> ModelSpec:
    m = cfg.model
    return ModelSpec(
        path=path,
        dtype=m.dtype,
        trust_remote_code=m.trust_remote_code,
        device=resolve_device(cfg),
        gradient_checkpointing=m.gradient_checkpointing,
        host_allocator=cfg.cluster.host_allocator,
    )


def precision_spec(fsdp: Any, *, offload_optimizer: bool = False) -> PrecisionSpec:
    """actor.fsdp / critic.fsdp (only the actor's has optimizer_offload: it shares its GPU with the
    rollout)."""
    return PrecisionSpec(
        param_dtype=fsdp.param_dtype,
        offload_params=fsdp.offload_params,
        reshard_after_forward=fsdp.reshard_after_forward,
        offload_optimizer=offload_optimizer,
    )


def shares_weights(cfg: RunConfig, *, sft: bool = False) -> bool:
    """rollout.weight_sharing resolved; auto shares where config/rollout_weights.py finds it safe."""
    mode = cfg.rollout.weight_sharing
    if mode in ("share", "copy"):
        return mode == "share"
    return not sharing_blockers(cfg, sft=sft)  # auto


def rollout_engine_spec(cfg: RunConfig, *, share_weights: bool) -> RolloutEngineSpec:
    r = cfg.rollout
    return RolloutEngineSpec(
        backend=r.backend,
        dtype=r.dtype,
        free_cache_engine=r.free_cache_engine,
        seed=cfg.trainer.seed,
        max_num_seqs=r.trajectories_per_generate_batch or None,  # 0: no bound of ours
        max_model_len=cfg.data.max_prompt_tokens + r.max_response_tokens,  # P + T
        partial_rollout=cfg.async_training.partial_rollout,
        share_weights=share_weights,
        decode_step=r.decode_step,
    )


def policy_spec(
    cfg: RunConfig, tokenizer: Any, *, total_steps: int, model_path: str | None = None
) -> PolicySpec:
    """The policy's spec (actor, rollout engine, reference, LoRA, precision) from the config; it
    builds the same `PolicyWorker` in this process and on every Ray rank."""
    actor, reference, lora = cfg.actor, cfg.reference, cfg.actor.lora
    optimizer = OptimizerSettings(
        lr=actor.lr,
        weight_decay=actor.weight_decay,
        betas=tuple(actor.betas),
        grad_clip=actor.grad_clip,
        lr_schedule=actor.lr_schedule,
        warmup_steps=actor.warmup_steps,
        total_steps=total_steps,
        min_lr_ratio=actor.min_lr_ratio,
        adamw_impl=actor.adamw_impl,
    )
    batching = BatchingSpec(
        actor.trajectories_per_micro_batch, actor.max_tokens_per_micro_batch, actor.layout
    )
    reference_batching = BatchingSpec(
        reference.trajectories_per_micro_batch, reference.max_tokens_per_micro_batch, reference.layout
    )
    targets = lora.target_modules
    return PolicySpec(
        model=model_spec(cfg, model_path or cfg.model.path),
        eos_token_ids=tuple(eos_token_ids(tokenizer)),
        pad_token_id=tokenizer.pad_token_id,
        actor=ActorSpec(optimizer, batching, actor.logit_chunk_size, temperature=cfg.rollout.temperature),
        rollout=rollout_engine_spec(cfg, share_weights=shares_weights(cfg)),
        reference=ReferenceSpec(
            reference_batching,
            reference.logit_chunk_size,
            model_spec(cfg, reference.model_path) if reference.model_path else None,
        )
        if cfg.uses_reference
        else None,
        teacher=teacher_spec(cfg) if cfg.cluster.backend == "in-process" else None,
        lora=LoraSpec(lora.rank, lora.alpha, targets if isinstance(targets, str) else tuple(targets))
        if lora.rank > 0
        else None,
        precision=precision_spec(actor.fsdp, offload_optimizer=actor.fsdp.optimizer_offload),
    )


def teacher_spec(cfg: RunConfig) -> TeacherSpec | None:
    """The distillation teachers (distillation.enabled) by name: each data_source of
    distillation.teachers, and DEFAULT_TEACHER for distillation.teacher_model_path. Each is a frozen
    model of its own, scored with the reference's machinery at its own micro-batch size and the
    reference's chunking and layout, at the rollout temperature; each must have the student's
    vocabulary (its config's vocab_size)."""
    d, r = cfg.distillation, cfg.reference
    if not d.enabled:
        return None
    batching = BatchingSpec(d.trajectories_per_micro_batch, r.max_tokens_per_micro_batch, r.layout)
    top_k = d.topk if get_distillation_loss(d.loss_mode).uses_top_k else 0
    paths = dict(d.teachers) | ({DEFAULT_TEACHER: d.teacher_model_path} if d.teacher_model_path else {})
    teachers = {
        name: ReferenceSpec(batching, r.logit_chunk_size, model_spec(cfg, path), top_k)
        for name, path in paths.items()
    }
    vocab = AutoConfig.from_pretrained(cfg.model.path).vocab_size
    return TeacherSpec(teachers, temperature=cfg.rollout.temperature, vocab_size=vocab)


def process_group_backend(cfg: RunConfig) -> str:
    """The torch.distributed backend of the training ranks: nccl when their models are on GPUs."""
    return "nccl" if resolve_device(cfg) == "cuda" else "gloo"


def build_policy_worker(
    cfg: RunConfig, tokenizer: Any, *, total_steps: int, model_path: str | None = None
) -> PolicyWorkerGroup:
    """The policy's handle: a worker group of one `PolicyWorker` in this process
    (cluster.backend=in-process), or of Ray processes placed by cluster.placement — the trainer calls
    both the same way, and both build their workers from the same `PolicySpec`."""
    spec = policy_spec(cfg, tokenizer, total_steps=total_steps, model_path=model_path)
    c = cfg.cluster
    if c.backend == "in-process":
        return PolicyWorkerGroup.in_process(spec, threads=c.threads_per_worker)
    from stratarl.cluster.ray_policy_group import start_policy_group

    n = cfg.rollout.n
    rows = {
        ("data.prompts_per_step", "rollout.n"): cfg.data.prompts_per_step * n,
        ("actor.prompts_per_mini_batch", "rollout.n"): cfg.actor.prompts_per_mini_batch * n,
    }
    if cfg.uses_critic:  # its half of each training bundle is reserved with the plan (build_critic_worker)
        rows[("critic.prompts_per_mini_batch", "rollout.n")] = cfg.critic.prompts_per_mini_batch * n
    group = start_policy_group(
        spec,
        placement_plan(cfg),
        address=c.address,
        num_cpus=c.num_cpus,
        call_timeout_s=c.call_timeout_s,
        threads_per_worker=c.threads_per_worker,
        backend=process_group_backend(cfg),
        queue_units=c.transfer_queue_units,
        rows_per_rank_split=rows,
        max_replica_restarts=cfg.rollout.max_replica_restarts,
    )
    teacher = teacher_spec(cfg)
    if teacher is not None:  # the plan reserved its pool; its process starts beside the policy's
        from stratarl.cluster.ray_teacher import start_teacher_beside

        try:
            start_teacher_beside(group, teacher)
        except BaseException:
            group.shutdown()
            raise
    return group


def placement_plan(cfg: RunConfig) -> PlacementPlan:
    """cluster.placement's plan (cluster.backend=ray) for the run's roles: the policy's, for PPO the
    critic (its half of each training bundle), and a reward model's pool of its own
    (reward.model.cpus / gpus) and a distillation teacher's (distillation.cpus / gpus) — all reserved
    when the policy group starts."""
    c, m = cfg.cluster, cfg.reward.model
    sizes = WorkerSizes(
        c.training_workers,
        c.rollout_replicas,
        c.cpus_per_training_worker,
        c.cpus_per_rollout_replica,
        c.gpus_per_training_worker,
        c.gpus_per_rollout_replica,
        reward_model_cpus=m.cpus,
        reward_model_gpus=m.gpus,
        teacher_cpus=cfg.distillation.cpus,
        teacher_gpus=cfg.distillation.gpus,
    )
    roles = ["actor", "rollout"] + (["reference"] if cfg.uses_reference else [])
    roles += (["critic"] if cfg.uses_critic else []) + (["reward_model"] if m.enable else [])
    roles += ["teacher"] if cfg.distillation.enabled else []
    return make_plan(c.placement, sizes, roles)


def build_critic_worker(
    cfg: RunConfig, *, total_steps: int, policy: PolicyWorkerGroup | None = None
) -> CriticWorkerGroup:
    """The value model: critic.model_path, else the policy's start (its body gets a fresh head). A
    worker group of one `CriticWorker` in this process (cluster.backend=in-process), or of Ray ranks
    of its own beside the policy's (`policy`, built first: its plan reserved the critic's half of
    each training bundle, and the critic reads the rows of its TransferQueue)."""
    spec = critic_spec(cfg, total_steps=total_steps)
    if cfg.cluster.backend == "in-process":
        return CriticWorkerGroup.in_process(spec, threads=cfg.cluster.threads_per_worker)
    from stratarl.cluster.ray_critic_group import start_critic_beside

    if policy is None or policy.deployment is None:
        raise TypeError(
            "cluster.backend=ray: the critic's ranks share the policy's pools and TransferQueue; build "
            f"the policy first and pass it as policy= (got {type(policy).__name__})"
        )
    return start_critic_beside(policy, spec, backend=process_group_backend(cfg))


def critic_spec(cfg: RunConfig, *, total_steps: int) -> CriticSpec:
    """The critic's spec from the config; it builds the same `CriticWorker` here and on every rank."""
    c = cfg.critic
    optimizer = OptimizerSettings(
        lr=c.lr,
        weight_decay=c.weight_decay,
        grad_clip=c.grad_clip,
        warmup_steps=c.warmup_steps,
        total_steps=total_steps,
        adamw_impl=c.adamw_impl,
    )
    return CriticSpec(
        model=dataclasses.replace(
            model_spec(cfg, c.model_path or cfg.model.path), gradient_checkpointing=c.gradient_checkpointing
        ),
        optimizer=optimizer,
        batching=BatchingSpec(c.trajectories_per_micro_batch, c.max_tokens_per_micro_batch, c.layout),
        precision=precision_spec(c.fsdp),
        # a fresh value head drawn from the run's seed: the same head in one process and on every
        # Ray rank, so both backends train the same critic
        init_seed=cfg.trainer.seed,
    )


def build_workers(
    cfg: RunConfig, tokenizer: Any, *, total_steps: int
) -> tuple[PolicyWorkerGroup, CriticWorkerGroup | None]:
    """The policy's handle and, for PPO, the critic's (None otherwise). When the critic cannot start,
    the policy's processes are stopped before the error propagates: none is left behind."""
    policy = build_policy_worker(cfg, tokenizer, total_steps=total_steps)
    if not cfg.uses_critic:
        return policy, None
    try:
        return policy, build_critic_worker(cfg, total_steps=total_steps, policy=policy)
    except BaseException:
        policy.shutdown()
        raise
