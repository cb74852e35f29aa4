"""Layer 1, config: what the run reads — datasets (`data.*`), the model (`model.*`), the scorer (`reward.*`).

Names say their unit: prompts (rows of the dataset) versus trajectories (one prompt's sampled
response; a step has prompts_per_step · rollout.n of them) versus tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stratarl.config.setting import setting


@dataclass
class DataConfig:
    """Prompt datasets in verl's parquet schema (data_source, prompt, ability, reward_model, extra_info)."""

    train_files: list[str] = setting(
        [],
        "parquet files of training prompts (a list: data.train_files=[a.parquet])",
        verl="data.train_files",
    )
    val_files: list[str] = setting(
        [], "parquet files of validation prompts; empty: no validation", verl="data.val_files"
    )
    prompt_key: str = setting(
        "prompt", "column holding the chat messages of a prompt", verl="data.prompt_key"
    )
    data_source_key: str = setting(
        "data_source", "column that picks the scoring function of a row", verl="data.reward_fn_key"
    )
    max_prompt_tokens: int = setting(
        512,
        "longest prompt in tokens, after the chat template (P); longer prompts are dropped or rejected",
        verl="data.max_prompt_length",
    )
    filter_overlong: bool = setting(
        True,
        "drop (and count) prompts longer than max_prompt_tokens instead of failing on them",
        verl="data.filter_overlong_prompts",
    )
    prompts_per_step: int = setting(
        16,
        "prompts drawn per training step (B); the step has B·rollout.n trajectories",
        verl="data.train_batch_size",
    )
    max_train_prompts: int = setting(
        -1,
        "use at most this many training prompts (a seeded subsample); -1: all",
        verl="data.train_max_samples",
    )
    max_val_prompts: int = setting(
        -1,
        "use at most this many validation prompts (a seeded subsample); -1: all",
        verl="data.val_max_samples",
    )
    shuffle: bool = setting(True, "shuffle the training prompts each epoch", verl="data.shuffle")
    seed: int | None = setting(None, "seed of the prompt sampler; null: trainer.seed", verl="data.seed")


@dataclass
class ModelConfig:
    """The policy model: any local HF causal-LM directory (config.json, weights, tokenizer files)."""

    path: str = setting(
        "", "directory of the HF model the actor starts from", verl="actor_rollout_ref.model.path"
    )
    tokenizer_path: str = setting(
        "", "directory of the tokenizer; empty: model.path", verl="actor_rollout_ref.model.tokenizer_path"
    )
    dtype: str = setting(
        "float32",
        "dtype of the trained weights",
        verl="actor_rollout_ref.actor.fsdp_config.model_dtype",
        choices=("float32", "bfloat16", "float16"),
    )
    trust_remote_code: bool = setting(
        False,
        "allow model code shipped inside the model directory",
        verl="actor_rollout_ref.model.trust_remote_code",
    )
    gradient_checkpointing: bool = setting(
        False,
        "recompute activations in the backward pass to save memory",
        verl="actor_rollout_ref.model.enable_gradient_checkpointing",
    )


@dataclass
class RewardConfig:
    """How a trajectory is scored: by data_source from the built-in registry, or by a custom function."""

    custom_function_path: str = setting(
        "",
        "python file with a custom scorer; empty: the built-in registry keyed by data_source",
        verl="custom_reward_function.path",
    )
    custom_function_name: str = setting(
        "compute_score",
        "name of the scorer in custom_function_path, called as f(data_source, solution_str, ground_truth, "
        "extra_info)",
        verl="custom_reward_function.name",
    )
    function_kwargs: dict[str, Any] = setting(
        {}, "extra keyword arguments passed to the scorer", verl="custom_reward_function.reward_kwargs"
    )
    timeout_s: float = setting(
        10.0, "seconds one call of the scorer may take; a timeout scores 0 and is counted"
    )
