"""Layer 1, config: what the run reads — datasets (`data.*`), the model (`model.*`), the reward (`reward.*`).

Names say their unit: prompts (rows of the dataset) versus trajectories (one prompt's sampled
response; a step has prompts_per_step · rollout.n of them) versus tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stratarl.config.errors import ConfigProblem
from stratarl.config.setting import section, setting


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
class RewardModelConfig:
    """A learned reward model as its own worker (with cluster.backend=ray a process on a pool of its own)."""

    enable: bool = setting(False, "add a reward model's score to the reward", verl="reward_model.enable")
    path: str = setting("", "directory of the HF reward model", verl="reward_model.model.path")
    kind: str = setting(
        "sequence_classification",
        "a sequence-classification model read at the last token, or a causal LM judging yes/no",
        choices=("sequence_classification", "causal_lm_judge"),
    )
    tokenizer_path: str = setting(
        "", "its tokenizer (and chat template); empty: path", verl="reward_model.model.input_tokenizer"
    )
    weight: float = setting(1.0, "weight of the reward model's score in the sum of reward sources")
    dtype: str = setting(
        "float32", "dtype of the reward model's weights", choices=("float32", "bfloat16", "float16")
    )
    trajectories_per_micro_batch: int = setting(
        8, "conversations per forward pass", verl="reward_model.micro_batch_size_per_gpu"
    )
    judge_template: str = setting(
        "Question: {prompt}\nAnswer: {response}\nIs the answer correct? Reply yes or no.",
        "causal_lm_judge: the judge's question; {prompt} is the last user message, {response} the response",
    )
    judge_yes: str = setting("yes", "causal_lm_judge: the one-token verdict whose probability is the score")
    judge_no: str = setting("no", "causal_lm_judge: the one-token verdict against")
    cpus: float = setting(
        1.0,
        "CPUs of the reward model's Ray process, its pool in the placement plan (cluster.backend=ray; "
        "> 0 unless gpus > 0, ≤ 1 or whole); its torch threads follow them unless cluster.threads_per_worker",
    )
    gpus: float = setting(
        0.0,
        "GPUs of the reward model's Ray process, its pool in the placement plan; > 0 runs the model on "
        "cuda (cluster.backend=ray)",
    )


@dataclass
class RemoteRewardConfig:
    """A reward served over HTTP: POST {data_source, solution_str, ground_truth, extra_info} → a number or
    a dict with `score`."""

    url: str = setting("", "URL of the reward server (http:// or https://); empty: no remote reward")
    weight: float = setting(1.0, "weight of the remote score in the sum of reward sources")
    requests_per_second: float = setting(10.0, "most requests per second (a token bucket)")
    burst: int = setting(1, "requests that may go at once above the rate")
    max_concurrency: int = setting(8, "requests in flight at once")
    timeout_s: float = setting(30.0, "seconds one request may take")
    max_retries: int = setting(3, "retries of a request after a connection error, timeout, 429 or 5xx")
    backoff_s: float = setting(0.5, "first retry delay; doubled each retry (Retry-After honoured)")


@dataclass
class OverlongBufferConfig:
    """DAPO's soft overlong penalty: 0 up to T − len tokens, then linear down to −penalty_factor at T."""

    enable: bool = setting(False, "add the overlong penalty", verl="reward_model.overlong_buffer.enable")
    len: int = setting(
        0,
        "buffer at the end of the response budget, in tokens (0 < len ≤ rollout.max_response_tokens)",
        verl="reward_model.overlong_buffer.len",
    )
    penalty_factor: float = setting(
        1.0, "the penalty at the full budget", verl="reward_model.overlong_buffer.penalty_factor"
    )


@dataclass
class RewardConfig:
    """How a trajectory is scored: rule functions (the built-in registry keyed by data_source, or a custom
    function), a reward model, a remote reward — summed with their weights — and the overlong penalty."""

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
    rule_weight: float = setting(
        1.0, "weight of the rule (or custom) scorer in the sum of reward sources; 0 turns it off"
    )
    in_process: bool = setting(
        False,
        "score in the trainer's process: fast, but no deadline and no isolation (a scorer that hangs or "
        "exits stops the run); false: reward.num_workers worker processes, each call under timeout_s",
    )
    num_workers: int = setting(2, "scoring worker processes", verl="reward.num_workers")
    timeout_s: float = setting(
        10.0, "seconds one call of the scorer may take in a worker; a timeout is a counted failure"
    )
    failure_score: float = setting(
        0.0, "score of a sample whose scorer failed (raised, timed out, exited, crashed, returned no number)"
    )
    max_output_bytes: int = setting(
        4096, "bytes of what one scorer call prints that are kept for the log; the rest is counted, dropped"
    )
    model: RewardModelConfig = section(RewardModelConfig, "a learned reward model")
    remote: RemoteRewardConfig = section(RemoteRewardConfig, "a reward served over HTTP")
    overlong_buffer: OverlongBufferConfig = section(OverlongBufferConfig, "DAPO's overlong penalty")


def reward_problems(reward: RewardConfig, *, max_response_tokens: int, backend: str) -> list[ConfigProblem]:
    """The problems of `reward.*` (part of `validate_config`); paths are checked with the others."""
    m, r, o = reward.model, reward.remote, reward.overlong_buffer
    checks = [
        (reward.num_workers < 1, ("reward.num_workers",), "must be ≥ 1"),
        (reward.max_output_bytes < 0, ("reward.max_output_bytes",), "must be ≥ 0"),
        (
            reward.rule_weight == 0 and not m.enable and not r.url,
            ("reward.rule_weight", "reward.model.enable", "reward.remote.url"),
            "no reward source: rule_weight is 0 and neither a reward model nor a remote reward is on",
        ),
        (
            m.enable and not m.path,
            ("reward.model.enable", "reward.model.path"),
            "a reward model needs a path",
        ),
        (
            m.enable and m.trajectories_per_micro_batch < 1,
            ("reward.model.trajectories_per_micro_batch",),
            "must be ≥ 1",
        ),
        (
            m.enable and m.kind == "causal_lm_judge" and "{response}" not in m.judge_template,
            ("reward.model.judge_template",),
            "must contain {response} (and may contain {prompt})",
        ),
        (m.cpus < 0 or m.gpus < 0, ("reward.model.cpus", "reward.model.gpus"), "must be ≥ 0"),
        (
            m.enable and m.gpus > 0 and backend != "ray",
            ("reward.model.gpus", "cluster.backend"),
            "a reward model on GPUs runs as a Ray process: set cluster.backend=ray",
        ),
        (
            m.enable and backend == "ray" and m.cpus == 0 and m.gpus == 0,
            ("reward.model.cpus", "reward.model.gpus"),
            "on Ray the reward model's process has a bundle of its own in the placement plan, and a "
            "bundle needs some CPU or GPU: give it reward.model.cpus > 0 (e.g. 1) or reward.model.gpus > 0",
        ),
        *(
            (
                m.enable and backend == "ray" and amount > 1 and amount != int(amount),
                (f"reward.model.{name}",),
                f"{amount:g} is not a share ≤ 1 or a whole number, what Ray can reserve for a process",
            )
            for name, amount in (("cpus", m.cpus), ("gpus", m.gpus))
        ),
        (
            bool(r.url) and not r.url.startswith(("http://", "https://")),
            ("reward.remote.url",),
            f"must start with http:// or https://, got {r.url!r}",
        ),
        (r.requests_per_second <= 0, ("reward.remote.requests_per_second",), "must be > 0"),
        (r.burst < 1, ("reward.remote.burst",), "must be ≥ 1"),
        (r.max_concurrency < 1, ("reward.remote.max_concurrency",), "must be ≥ 1"),
        (r.timeout_s <= 0, ("reward.remote.timeout_s",), "must be > 0"),
        (
            r.max_retries < 0 or r.backoff_s < 0,
            ("reward.remote.max_retries", "reward.remote.backoff_s"),
            "must be ≥ 0",
        ),
        (
            o.enable and not 0 < o.len <= max_response_tokens,
            ("reward.overlong_buffer.len", "rollout.max_response_tokens"),
            f"must be in (0, rollout.max_response_tokens={max_response_tokens}], got {o.len}",
        ),
        (o.penalty_factor < 0, ("reward.overlong_buffer.penalty_factor",), "must be ≥ 0"),
    ]
    return [ConfigProblem(keys, message) for fails, keys, message in checks if fails]
