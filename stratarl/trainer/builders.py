"""Layer 2, control flow: builders that turn the run config into components and plain arguments.

Config stops here (docs/design.md#config-stops-at-the-boundary): everything below the trainer
receives typed specs (`cluster.specs`: one per role, in one process and on Ray) or keyword arguments.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stratarl.algo.advantages import get_advantage_estimator
from stratarl.algo.kl_control import KLController, make_kl_controller
from stratarl.cluster.critic_group import CriticWorkerGroup
from stratarl.cluster.placement import PlacementPlan, WorkerSizes, make_plan
from stratarl.cluster.specs import (
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
)
from stratarl.cluster.worker_group import PolicyWorkerGroup
from stratarl.config import RunConfig
from stratarl.config.rollout_weights import sharing_blockers
from stratarl.data import tokenizer_loading
from stratarl.data.collate import collate_prompts
from stratarl.data.prompt_dataset import PromptDataset, load_prompt_dataset
from stratarl.reward.custom import load_custom_scorer
from stratarl.reward.registry import default_compute_score
from stratarl.rollout.interface import SamplingParams
from stratarl.trainer.actor_loss import ActorLoss
from stratarl.trainer.critic_loss import ValueLoss
from stratarl.transport.data_proto import DataProto


def seed_everything(seed: int) -> None:
    """Seed python's, numpy's and torch's global generators (a run's first act)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def load_tokenizer(cfg: RunConfig) -> Any:
    """The policy's tokenizer, with a pad token (`data.tokenizer_loading`)."""
    return tokenizer_loading.load_tokenizer(
        cfg.model.tokenizer_path or cfg.model.path, trust_remote_code=cfg.model.trust_remote_code
    )


def eos_token_ids(tokenizer: Any) -> list[int]:
    ids = tokenizer.eos_token_id
    return [ids] if isinstance(ids, int) else list(ids)


def data_columns(cfg: RunConfig) -> dict[str, Any]:
    """How rows are read (data.prompt_key, data.data_source_key, data.filter_overlong), as the keyword
    arguments of `load_prompts`."""
    d = cfg.data
    return {
        "prompt_key": d.prompt_key,
        "data_source_key": d.data_source_key,
        "filter_overlong": d.filter_overlong,
    }


def load_prompts(
    files: list[str],
    tokenizer: Any,
    *,
    max_prompt_tokens: int,
    limit: int | None,
    seed: int = 0,
    **columns: Any,
) -> PromptDataset:
    """The prompts of `files`; with 0 ≤ limit < their number, a seeded subsample of `limit` of them in
    file order (data.max_*_prompts; a negative limit or None keeps all). `columns`: `data_columns`."""
    dataset = load_prompt_dataset(files, tokenizer, max_prompt_tokens=max_prompt_tokens, **columns)
    if limit is not None and 0 <= limit < len(dataset):
        keep = np.sort(np.random.default_rng(seed).choice(len(dataset), size=limit, replace=False))
        dataset = PromptDataset([dataset.items[i] for i in keep], dataset.report)
    return dataset


def prompts_batch(dataset: PromptDataset, indices: list[int], pad_token_id: int) -> DataProto:
    """B dataset rows as a DataProto of their non-tensor columns (prompt ids, sources, answers)."""
    batch = collate_prompts([dataset[i] for i in indices], pad_token_id=pad_token_id)
    return DataProto.from_dict(non_tensors=batch.non_tensors)


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
        lora=LoraSpec(lora.rank, lora.alpha, targets if isinstance(targets, str) else tuple(targets))
        if lora.rank > 0
        else None,
        precision=precision_spec(actor.fsdp, offload_optimizer=actor.fsdp.optimizer_offload),
    )


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
    return start_policy_group(
        spec,
        placement_plan(cfg),
        address=c.address,
        num_cpus=c.num_cpus,
        call_timeout_s=c.call_timeout_s,
        threads_per_worker=c.threads_per_worker,
        backend=process_group_backend(cfg),
        queue_units=c.transfer_queue_units,
        rows_per_rank_split=rows,
    )


def placement_plan(cfg: RunConfig) -> PlacementPlan:
    """cluster.placement's plan (cluster.backend=ray) for the run's roles: the policy's, for PPO the
    critic (its half of each training bundle), and a reward model's pool of its own
    (reward.model.cpus / gpus) — all reserved when the policy group starts."""
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
    )
    roles = ["actor", "rollout"] + (["reference"] if cfg.uses_reference else [])
    roles += (["critic"] if cfg.uses_critic else []) + (["reward_model"] if m.enable else [])
    return make_plan(c.placement, sizes, roles)


def rollout_correction_settings(cfg: RunConfig) -> dict[str, Any]:
    """Keyword arguments of `algo.rollout_correction.rollout_correction` from algorithm.rollout_correction."""
    rc = cfg.algorithm.rollout_correction
    return {
        "rollout_is": rc.rollout_is,
        "rollout_is_threshold": rc.rollout_is_threshold,
        "rollout_is_batch_normalize": rc.rollout_is_batch_normalize,
        "rollout_rs": rc.rollout_rs,
        "rollout_rs_threshold": rc.rollout_rs_threshold,
    }


# algorithm.rollout_correction.loss_type -> the policy loss bypass mode trains with
BYPASS_LOSSES = {"ppo_clip": "vanilla", "reinforce": "reinforce"}


def build_actor_loss(cfg: RunConfig, *, old_log_prob_from_forward: bool = False) -> ActorLoss:
    """The actor's loss; old_log_prob_from_forward: π_old from the update's forward (`pi_old.FromUpdate`)."""
    settings = asdict(cfg.actor.policy_loss)
    name = settings.pop("name")
    bypass = cfg.algorithm.rollout_correction.bypass_mode
    if bypass:  # verl forces the loss: PPO clip against π_rollout, or REINFORCE with IS weights
        name = BYPASS_LOSSES[cfg.algorithm.rollout_correction.loss_type]
    return ActorLoss.from_settings(
        name,
        settings,
        bypass_correction=rollout_correction_settings(cfg) if bypass else None,
        loss_agg_mode=cfg.actor.loss_agg_mode,
        loss_scale_factor=cfg.actor.loss_scale_factor,
        entropy_coeff=cfg.actor.entropy_coeff,
        kl_loss_coef=cfg.actor.kl_loss_coef if cfg.actor.use_kl_loss else 0.0,
        kl_loss_type=cfg.actor.kl_loss_type,
        clip_bounds=(cfg.actor.policy_loss.clip_ratio_low, cfg.actor.policy_loss.clip_ratio_high),
        old_log_prob_from_forward=old_log_prob_from_forward,
    )


def train_sampling(cfg: RunConfig) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=max(r.top_k, 0),
        max_tokens=r.max_response_tokens,
        ignore_eos=r.ignore_eos,
        min_tokens=r.min_response_tokens,
    )


def val_sampling(cfg: RunConfig) -> SamplingParams:
    v = cfg.rollout.val_kwargs
    return SamplingParams(
        temperature=0.0 if v.greedy else v.temperature,
        top_p=v.top_p,
        top_k=max(v.top_k, 0),
        max_tokens=cfg.rollout.max_response_tokens,
    )


def build_compute_score(cfg: RunConfig):
    """The reward function: a custom one by file path, else the registry keyed by data_source."""
    r = cfg.reward
    if r.custom_function_path:
        return load_custom_scorer(Path(r.custom_function_path), r.custom_function_name, **r.function_kwargs)
    return default_compute_score


def advantage_hyperparameters(cfg: RunConfig) -> dict[str, Any]:
    a = cfg.algorithm
    return {
        "gamma": a.gamma,
        "lam": a.lam,
        "norm_adv_by_std": a.norm_adv_by_std,
        "weights": list(a.gdpo_reward_weights) or None,  # gdpo only; None keeps equal weights
    }


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


def build_kl_controller(cfg: RunConfig) -> KLController | None:
    """algorithm.kl_ctrl's controller of β when KL is in the reward (use_kl_in_reward); else None."""
    a = cfg.algorithm
    if not a.use_kl_in_reward:
        return None
    c = a.kl_ctrl
    return make_kl_controller(c.type, kl_coef=c.kl_coef, target_kl=c.target_kl, horizon=c.horizon)


def build_value_loss(cfg: RunConfig) -> ValueLoss:
    return ValueLoss(cliprange_value=cfg.critic.cliprange_value, loss_agg_mode=cfg.critic.loss_agg_mode)


def estimator_inputs(cfg: RunConfig) -> frozenset[str]:
    """The batch fields the configured advantage estimator requires (e.g. values, sum_pi_squared)."""
    return get_advantage_estimator(cfg.algorithm.adv_estimator).inputs
