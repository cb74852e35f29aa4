"""Layer 2, control flow: builders that turn the run config into components and plain arguments.

Config stops here (STYLE.md principle 4): everything below the trainer receives keyword arguments.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stratarl.algo.advantages import get_advantage_estimator
from stratarl.algo.kl_control import KLController, make_kl_controller
from stratarl.cluster.critic_worker import CriticWorker
from stratarl.cluster.policy_worker import PolicyWorker
from stratarl.config import RunConfig
from stratarl.data import tokenizer_loading
from stratarl.data.collate import collate_prompts
from stratarl.data.prompt_dataset import PromptDataset, load_prompt_dataset
from stratarl.reward.custom import load_custom_scorer
from stratarl.reward.registry import default_compute_score
from stratarl.rollout.interface import SamplingParams
from stratarl.trainer.actor_loss import ActorLoss
from stratarl.trainer.critic_loss import ValueLoss
from stratarl.transport.data_proto import DataProto

if TYPE_CHECKING:  # the Ray backend imports ray: only when cluster.backend=ray asks for it
    from stratarl.cluster.critic_group import CriticWorkerGroup
    from stratarl.cluster.worker_group import PolicyWorkerGroup


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


def build_policy_worker(
    cfg: RunConfig, tokenizer: Any, *, total_steps: int, model_path: str | None = None
) -> PolicyWorker | PolicyWorkerGroup:
    """The policy's handle: one `PolicyWorker` in this process (cluster.backend=in-process), or a
    worker group of Ray processes placed by cluster.placement — the trainer calls both the same way."""
    kwargs = policy_worker_kwargs(cfg, tokenizer, total_steps=total_steps, model_path=model_path)
    if cfg.cluster.backend != "ray":
        return PolicyWorker(**kwargs)
    from stratarl.cluster.placement import WorkerSizes, make_plan
    from stratarl.cluster.policy_rank import PolicySpec
    from stratarl.cluster.ray_policy_group import RayPolicyGroup

    c, n = cfg.cluster, cfg.rollout.n
    sizes = WorkerSizes(
        c.training_workers,
        c.rollout_replicas,
        c.cpus_per_training_worker,
        c.cpus_per_rollout_replica,
        c.gpus_per_training_worker,
        c.gpus_per_rollout_replica,
    )
    roles = ["actor", "rollout"] + (["reference"] if cfg.uses_reference else [])
    rows = {
        ("data.prompts_per_step", "rollout.n"): cfg.data.prompts_per_step * n,
        ("actor.prompts_per_mini_batch", "rollout.n"): cfg.actor.prompts_per_mini_batch * n,
    }
    if cfg.uses_critic:  # its half of each training bundle is reserved with the plan (build_critic_worker)
        roles.append("critic")
        rows[("critic.prompts_per_mini_batch", "rollout.n")] = cfg.critic.prompts_per_mini_batch * n
    return RayPolicyGroup(
        PolicySpec(**kwargs),
        make_plan(c.placement, sizes, roles),
        address=c.address,
        num_cpus=c.num_cpus,
        call_timeout_s=c.call_timeout_s,
        threads_per_worker=c.threads_per_worker,
        backend="nccl" if c.gpus_per_training_worker > 0 else "gloo",
        queue_units=c.transfer_queue_units,
        rows_per_rank_split=rows,
    )


def policy_worker_kwargs(
    cfg: RunConfig, tokenizer: Any, *, total_steps: int, model_path: str | None = None
) -> dict[str, Any]:
    """The keyword arguments of `PolicyWorker` (and of each Ray rank's) from the config."""
    actor, reference, lora = cfg.actor, cfg.reference, cfg.actor.lora
    return dict(
        model_path=model_path or cfg.model.path,
        eos_token_ids=tuple(eos_token_ids(tokenizer)),
        pad_token_id=tokenizer.pad_token_id,
        dtype=cfg.model.dtype,
        with_reference=cfg.uses_reference,
        rollout_seed=cfg.trainer.seed,
        max_num_seqs=cfg.rollout.trajectories_per_generate_batch or 1_000_000,
        lora={"rank": lora.rank, "alpha": lora.alpha, "target_modules": lora.target_modules}
        if lora.rank > 0
        else None,
        reference_kwargs={
            "micro_batch_size": reference.trajectories_per_micro_batch,
            "max_tokens_per_micro_batch": reference.max_tokens_per_micro_batch,
            "layout": reference.layout,
            "logit_chunk_size": reference.logit_chunk_size,
        },
        actor_kwargs={
            "lr": actor.lr,
            "micro_batch_size": actor.trajectories_per_micro_batch,
            "temperature": cfg.rollout.temperature,
            "weight_decay": actor.weight_decay,
            "betas": tuple(actor.betas),
            "grad_clip": actor.grad_clip,
            "lr_schedule": actor.lr_schedule,
            "warmup_steps": actor.warmup_steps,
            "total_steps": total_steps,
            "min_lr_ratio": actor.min_lr_ratio,
            "max_tokens_per_micro_batch": actor.max_tokens_per_micro_batch,
            "layout": actor.layout,
            "logit_chunk_size": actor.logit_chunk_size,
            "gradient_checkpointing": cfg.model.gradient_checkpointing,
        },
    )


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


def build_actor_loss(cfg: RunConfig) -> ActorLoss:
    settings = asdict(cfg.actor.policy_loss)
    name = settings.pop("name")
    bypass = cfg.algorithm.rollout_correction.bypass_mode
    if bypass:  # verl forces the loss: PPO clip against π_rollout, or REINFORCE with IS weights
        name = "reinforce" if cfg.algorithm.rollout_correction.loss_type == "reinforce" else "vanilla"
    return ActorLoss.from_settings(
        name,
        settings,
        bypass_correction=rollout_correction_settings(cfg) if bypass else None,
        loss_agg_mode=cfg.actor.loss_agg_mode,
        loss_scale_factor=cfg.actor.loss_scale_factor,
        entropy_coeff=cfg.actor.entropy_coeff,
        kl_loss_coef=cfg.actor.kl_loss_coef if cfg.actor.use_kl_loss else 0.0,
        kl_loss_type=cfg.actor.kl_loss_type,
    )


def train_sampling(cfg: RunConfig) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(
        temperature=r.temperature, top_p=r.top_p, top_k=max(r.top_k, 0), max_tokens=r.max_response_tokens
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
    cfg: RunConfig, *, total_steps: int, policy: PolicyWorker | PolicyWorkerGroup | None = None
) -> CriticWorker | CriticWorkerGroup:
    """The value model: critic.model_path, else the policy's start (its body gets a fresh head). One
    `CriticWorker` in this process (cluster.backend=in-process), or Ray ranks of its own beside the
    policy's (`policy`, built first: its plan reserved the critic's half of each training bundle,
    and the critic reads the rows of its TransferQueue)."""
    kwargs = critic_worker_kwargs(cfg, total_steps=total_steps)
    if cfg.cluster.backend != "ray":
        return CriticWorker(**kwargs)
    from stratarl.cluster.critic_rank import CriticSpec
    from stratarl.cluster.ray_critic_group import RayCriticGroup
    from stratarl.cluster.ray_policy_group import RayPolicyGroup

    if not isinstance(policy, RayPolicyGroup):
        raise TypeError(
            "cluster.backend=ray: the critic's ranks share the policy's pools and TransferQueue; build "
            f"the policy first and pass it as policy= (got {type(policy).__name__})"
        )
    backend = "nccl" if cfg.cluster.gpus_per_training_worker > 0 else "gloo"
    spec = CriticSpec(**kwargs)
    return RayCriticGroup.beside(policy, spec, backend=backend)


def critic_worker_kwargs(cfg: RunConfig, *, total_steps: int) -> dict[str, Any]:
    """The keyword arguments of `CriticWorker` (and of each Ray rank's) from the config."""
    c = cfg.critic
    return dict(
        model_path=c.model_path or cfg.model.path,
        dtype=cfg.model.dtype,
        # a fresh value head drawn from the run's seed: the same head in one process and on every
        # Ray rank, so both backends train the same critic
        init_seed=cfg.trainer.seed,
        critic_kwargs={
            "lr": c.lr,
            "micro_batch_size": c.trajectories_per_micro_batch,
            "weight_decay": c.weight_decay,
            "grad_clip": c.grad_clip,
            "warmup_steps": c.warmup_steps,
            "total_steps": total_steps,
            "max_tokens_per_micro_batch": c.max_tokens_per_micro_batch,
            "layout": c.layout,
            "gradient_checkpointing": c.gradient_checkpointing,
        },
    )


def build_workers(
    cfg: RunConfig, tokenizer: Any, *, total_steps: int
) -> tuple[PolicyWorker | PolicyWorkerGroup, Any]:
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
