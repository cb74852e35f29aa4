"""Layer 2, control flow: builders that turn the run config into components and plain arguments.

Config stops here (STYLE.md principle 4): everything below the trainer receives keyword arguments.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from stratarl.cluster.policy_worker import PolicyWorker
from stratarl.config import RunConfig
from stratarl.data.collate import collate_prompts
from stratarl.data.prompt_dataset import PromptDataset, load_prompt_dataset
from stratarl.reward.custom import load_custom_scorer
from stratarl.reward.registry import default_compute_score
from stratarl.rollout.interface import SamplingParams
from stratarl.trainer.actor_loss import ActorLoss
from stratarl.transport.data_proto import DataProto


def load_tokenizer(cfg: RunConfig) -> Any:
    return AutoTokenizer.from_pretrained(cfg.model.tokenizer_path or cfg.model.path)


def eos_token_ids(tokenizer: Any) -> list[int]:
    ids = tokenizer.eos_token_id
    return [ids] if isinstance(ids, int) else list(ids)


def load_prompts(
    files: list[str], tokenizer: Any, *, max_prompt_tokens: int, limit: int | None
) -> PromptDataset:
    dataset = load_prompt_dataset(files, tokenizer, max_prompt_tokens=max_prompt_tokens)
    if limit:  # a quick run on a prefix of the dataset (data.max_*_prompts)
        dataset = PromptDataset(dataset.items[:limit], dataset.report)
    return dataset


def prompts_batch(dataset: PromptDataset, indices: list[int], pad_token_id: int) -> DataProto:
    """B dataset rows as a DataProto of their non-tensor columns (prompt ids, sources, answers)."""
    batch = collate_prompts([dataset[i] for i in indices], pad_token_id=pad_token_id)
    return DataProto.from_dict(non_tensors=batch.non_tensors)


def build_policy_worker(
    cfg: RunConfig, tokenizer: Any, *, total_steps: int, model_path: str | None = None
) -> PolicyWorker:
    actor = cfg.actor
    return PolicyWorker(
        model_path=model_path or cfg.model.path,
        eos_token_ids=eos_token_ids(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        dtype=cfg.model.dtype,
        with_reference=cfg.uses_reference,
        rollout_seed=cfg.trainer.seed,
        max_num_seqs=cfg.rollout.trajectories_per_generate_batch or 1_000_000,
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
