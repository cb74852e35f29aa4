"""Layer 1, config: `validate_config` — every reason a config cannot run, found before anything heavy starts.

Names of estimators, losses, aggregations and KL estimators are checked against the registries in
`stratarl/algo/`, so the valid names in an error are exactly what the math layer offers. All problems
are collected and raised together; things that run but are probably unintended come back as warnings.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from stratarl.algo import catalog
from stratarl.config.batch_plan import batch_size_problems
from stratarl.config.errors import ConfigError, ConfigProblem
from stratarl.config.model_dirs import model_dir_problems, tokenizer_dir_problems
from stratarl.config.number_bounds import number_problems
from stratarl.config.rollout_weights import weight_sharing_problems
from stratarl.config.runtime_checks import runtime_problems
from stratarl.config.schema_agent import agent_problems, gateway_problems
from stratarl.config.schema_async import async_problems, async_warnings
from stratarl.config.schema_data import reward_problems
from stratarl.config.schema_distillation import distillation_problems
from stratarl.config.schema_observe import observe_problems
from stratarl.config.schema_run import RunConfig
from stratarl.config.setting import get_by_key, leaf_settings, type_name, value_matches_type

Rule = tuple[Callable[[Any], bool], str]
POSITIVE: Rule = (lambda v: v > 0, "> 0")
NON_NEGATIVE: Rule = (lambda v: v >= 0, "≥ 0")
UNIT_INTERVAL: Rule = (lambda v: 0 <= v <= 1, "in [0, 1]")
NULL_OR_POSITIVE: Rule = (lambda v: v is None or v > 0, "null or > 0")
ALL_OR_POSITIVE: Rule = (lambda v: v == -1 or v > 0, "-1 (all) or > 0")
PROBABILITY_MASS: Rule = (lambda v: 0 < v <= 1, "in (0, 1]")
BETAS: Rule = (lambda v: len(v) == 2 and all(0 <= b < 1 for b in v), "two numbers in [0, 1)")

RANGES: dict[str, Rule] = {
    "data.max_train_prompts": ALL_OR_POSITIVE,
    "data.max_val_prompts": ALL_OR_POSITIVE,
    "rollout.temperature": NON_NEGATIVE,
    "rollout.top_p": PROBABILITY_MASS,
    "rollout.top_k": ALL_OR_POSITIVE,
    "rollout.trajectories_per_generate_batch": NON_NEGATIVE,
    "rollout.min_response_tokens": NON_NEGATIVE,
    "rollout.max_replica_restarts": NON_NEGATIVE,
    "rollout.val_kwargs.n": POSITIVE,
    "rollout.val_kwargs.temperature": NON_NEGATIVE,
    "rollout.val_kwargs.top_p": PROBABILITY_MASS,
    "rollout.val_kwargs.top_k": ALL_OR_POSITIVE,
    "actor.lr": NON_NEGATIVE,
    "actor.weight_decay": NON_NEGATIVE,
    "actor.betas": BETAS,
    "actor.warmup_steps": NON_NEGATIVE,
    "actor.min_lr_ratio": UNIT_INTERVAL,
    "actor.grad_clip": POSITIVE,
    "actor.policy_loss.clip_ratio_low": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "actor.policy_loss.clip_ratio_high": NON_NEGATIVE,
    "actor.policy_loss.clip_ratio_c": (lambda v: v > 1, "> 1"),
    "actor.loss_scale_factor": NULL_OR_POSITIVE,
    "actor.kl_loss_coef": NON_NEGATIVE,
    "reference.trajectories_per_micro_batch": POSITIVE,
    "critic.lr": NON_NEGATIVE,
    "critic.grad_clip": POSITIVE,
    "critic.ppo_epochs": POSITIVE,
    "critic.cliprange_value": POSITIVE,
    "critic.warmup_training_steps": NON_NEGATIVE,
    "algorithm.gamma": UNIT_INTERVAL,
    "algorithm.lam": UNIT_INTERVAL,
    "algorithm.kl_ctrl.kl_coef": NON_NEGATIVE,
    "algorithm.pf_ppo.weight_pow": NON_NEGATIVE,  # a negative power gives a score of 0 infinite weight
    "reward.timeout_s": POSITIVE,
    "trainer.total_steps": NULL_OR_POSITIVE,
    "trainer.total_epochs": POSITIVE,
    "cluster.num_cpus": NULL_OR_POSITIVE,
    "cluster.threads_per_worker": NULL_OR_POSITIVE,
    "cluster.training_workers": POSITIVE,
    "cluster.rollout_replicas": POSITIVE,
    "cluster.cpus_per_training_worker": NON_NEGATIVE,
    "cluster.cpus_per_rollout_replica": NON_NEGATIVE,
    "cluster.gpus_per_training_worker": NON_NEGATIVE,
    "cluster.gpus_per_rollout_replica": NON_NEGATIVE,
    "cluster.call_timeout_s": POSITIVE,
    "cluster.transfer_queue_units": NON_NEGATIVE,
    "trainer.max_checkpoints_to_keep": NULL_OR_POSITIVE,
    "sft.total_epochs": POSITIVE,
    "sft.total_steps": NULL_OR_POSITIVE,
    "sft.lr": NON_NEGATIVE,
    "sft.min_lr_ratio": UNIT_INTERVAL,
    "sft.grad_clip": POSITIVE,
    "sft.trajectories_per_step": POSITIVE,
    "sft.trajectories_per_micro_batch": POSITIVE,
    "sft.max_tokens": POSITIVE,
    "sft.test_freq": NON_NEGATIVE,
    "sft.stop_on_plateau": NON_NEGATIVE,
    "sft.plateau_delta": NON_NEGATIVE,
}


def validate_config(cfg: RunConfig, *, check_paths: bool = True) -> list[str]:
    """Raise ConfigError listing every problem of `cfg` (each naming its keys); return warnings.

    check_paths=False skips the existence of data files and model directories, for callers that
    create them after validating (the quickstart)."""
    # A config built in Python skips OmegaConf's type checks; the checks below assume the types hold.
    mistyped = _type_problems(cfg) or number_problems(cfg)  # infinities and overflows confuse what follows
    if mistyped:
        raise ConfigError(mistyped)
    problems = [
        *_name_problems(cfg),
        *batch_size_problems(cfg),
        *_range_problems(cfg),
        *_combination_problems(cfg),
        *_engine_problems(cfg),
        *runtime_problems(cfg),
        *agent_problems(cfg.agent, adv_estimator=cfg.algorithm.adv_estimator, check_paths=check_paths),
        *gateway_problems(
            cfg.agent.gateway,
            agent_enable=cfg.agent.enable,
            adv_estimator=cfg.algorithm.adv_estimator,
            filter_groups=cfg.algorithm.filter_groups.enable,
            check_paths=check_paths,
        ),
        *observe_problems(cfg.trace, cfg.watchdog),
        *async_problems(cfg),
        *weight_sharing_problems(cfg),
        *reward_problems(
            cfg.reward, max_response_tokens=cfg.rollout.max_response_tokens, backend=cfg.cluster.backend
        ),
        *distillation_problems(
            cfg.distillation,
            model_path=cfg.model.path,
            backend=cfg.cluster.backend,
            check_paths=check_paths,
        ),
        *(_path_problems(cfg) if check_paths else []),
    ]
    if problems:
        raise ConfigError(problems)
    return config_warnings(cfg)


def registries() -> dict[str, tuple[str, Collection[str]]]:
    """Config key -> (what it names, the valid names): the names of `stratarl/algo/`'s registries, from
    its torch-free catalog (`stratarl.algo.catalog`)."""
    return {
        "algorithm.adv_estimator": ("advantage estimator", catalog.ESTIMATOR_INPUTS),
        "actor.policy_loss.name": ("policy loss", catalog.POLICY_LOSS_AGGREGATION),
        "actor.loss_agg_mode": ("loss aggregation", catalog.LOSS_AGGREGATION_NAMES),
        "critic.loss_agg_mode": ("loss aggregation", catalog.LOSS_AGGREGATION_NAMES),
        "actor.kl_loss_type": ("KL estimator", catalog.KL_ESTIMATOR_NAMES),
        "algorithm.kl_penalty": ("KL estimator", catalog.KL_ESTIMATOR_NAMES),
        "algorithm.kl_ctrl.type": ("KL controller", catalog.KL_CONTROLLER_NAMES),
        "algorithm.pf_ppo.reweight_method": ("PF-PPO reweight method", catalog.PF_PPO_REWEIGHT_METHODS),
        "distillation.loss_mode": ("distillation loss", catalog.DISTILLATION_LOSS_KINDS),
    }


def _unknown_name(what: str, value: Any, valid: Collection[str], noun: str = "names") -> str:
    close = difflib.get_close_matches(str(value), list(valid), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown {what} {value!r}; valid {noun}: {sorted(valid)}{hint}"


def _type_problems(cfg: RunConfig) -> list[ConfigProblem]:
    problems = []
    for key, info in leaf_settings(RunConfig).items():
        value = get_by_key(cfg, key)
        if not value_matches_type(value, info.type):
            problems.append(ConfigProblem((key,), f"expected {type_name(info.type)}, got {value!r}"))
    return problems


def _name_problems(cfg: RunConfig) -> list[ConfigProblem]:
    """Values outside a setting's declared choices or outside an algo registry."""
    problems = []
    for key, info in leaf_settings(RunConfig).items():
        if not info.choices:
            continue
        value = get_by_key(cfg, key)
        for item in value if isinstance(value, list) else [value]:
            if item is not None and item not in info.choices:  # None: an optional setting left off
                problems.append(
                    ConfigProblem((key,), _unknown_name("value", item, info.choices, noun="values"))
                )
    for key, (what, valid) in registries().items():
        value = get_by_key(cfg, key)
        if value not in valid:
            problems.append(ConfigProblem((key,), _unknown_name(what, value, valid)))
    return problems


def _range_problems(cfg: RunConfig) -> list[ConfigProblem]:
    problems = []
    for key, (holds, requirement) in RANGES.items():
        value = get_by_key(cfg, key)
        if not holds(value):
            problems.append(ConfigProblem((key,), f"must be {requirement}, got {value!r}"))
    return problems


def _estimator_inputs(cfg: RunConfig) -> frozenset[str]:
    """Batch fields the configured estimator reads (empty for an unknown name, reported elsewhere)."""
    return catalog.ESTIMATOR_INPUTS.get(cfg.algorithm.adv_estimator, frozenset())


def _combination_problems(cfg: RunConfig) -> list[ConfigProblem]:
    """Settings that are fine alone but cannot run together."""
    estimator, inputs = cfg.algorithm.adv_estimator, _estimator_inputs(cfg)
    loss, val, kl_ctrl, sft = cfg.actor.policy_loss, cfg.rollout.val_kwargs, cfg.algorithm.kl_ctrl, cfg.sft
    checks = [  # (fails, keys, message)
        (
            "values" in inputs and not cfg.uses_critic,
            ("algorithm.adv_estimator", "critic.enable"),
            f"estimator {estimator!r} needs values from a critic, but critic.enable is false",
        ),
        (
            "group" in inputs and cfg.rollout.n < 2,
            ("algorithm.adv_estimator", "rollout.n"),
            f"estimator {estimator!r} compares the samples of one prompt, but rollout.n={cfg.rollout.n}: "
            "a group of one has no baseline (verl silently falls back to the raw score, or 0); "
            "set rollout.n ≥ 2, or use a non-group estimator such as reinforce_plus_plus",
        ),
        (
            bool(cfg.algorithm.rollout_correction.rollout_rs)
            and cfg.algorithm.rollout_correction.rollout_rs_threshold is None,
            ("algorithm.rollout_correction.rollout_rs", "algorithm.rollout_correction.rollout_rs_threshold"),
            "rejection sampling (rollout_rs) needs rollout_rs_threshold: one value per option or one for "
            "all; k1 options take 'lower_upper' ratio bounds such as 0.5_2.0",
        ),
        (
            cfg.algorithm.adv_estimator == "gdpo" and not cfg.algorithm.gdpo_reward_keys,
            ("algorithm.adv_estimator", "algorithm.gdpo_reward_keys"),
            "gdpo normalises reward components separately: list them in algorithm.gdpo_reward_keys "
            "(keys the scorer returns, e.g. [acc, format_ok])",
        ),
        (
            loss.name == "dro" and (loss.dro_beta is None or loss.dro_beta <= 0),
            ("actor.policy_loss.name", "actor.policy_loss.dro_beta"),
            f"policy loss 'dro' needs actor.policy_loss.dro_beta > 0, got {loss.dro_beta}",
        ),
        (
            not val.greedy and val.temperature <= 0,
            ("rollout.val_kwargs.greedy", "rollout.val_kwargs.temperature"),
            "sampling (greedy=false) needs temperature > 0; set greedy=true for argmax decoding",
        ),
        (
            kl_ctrl.type == "adaptive" and (kl_ctrl.target_kl <= 0 or kl_ctrl.horizon <= 0),
            ("algorithm.kl_ctrl.target_kl", "algorithm.kl_ctrl.horizon"),
            f"the adaptive controller needs target_kl > 0 and horizon > 0, got {kl_ctrl.target_kl} and "
            f"{kl_ctrl.horizon}",
        ),
        (
            "sum_pi_squared" in inputs and cfg.algorithm.rollout_correction.bypass_mode,
            ("algorithm.adv_estimator", "algorithm.rollout_correction.bypass_mode"),
            f"estimator {estimator!r} needs Σπ² from the actor's log-prob forward, which bypass mode skips",
        ),
        (
            cfg.trainer.resume_mode == "resume_path"
            and not re.fullmatch(r"global_step_\d+", Path(cfg.trainer.resume_from_path).name),
            ("trainer.resume_from_path",),
            f"must name a global_step_N checkpoint directory, got {cfg.trainer.resume_from_path!r}",
        ),
        (
            sft.stop_on_plateau > 0 and (sft.test_freq <= 0 or not cfg.data.val_files),
            ("sft.stop_on_plateau", "sft.test_freq", "data.val_files"),
            "sft.stop_on_plateau stops on held-out accuracy: it needs sft.test_freq > 0 and data.val_files "
            f"(got sft.test_freq={sft.test_freq}, {len(cfg.data.val_files)} validation files)",
        ),
        (
            sft.trajectories_per_micro_batch > 0
            and sft.trajectories_per_step % sft.trajectories_per_micro_batch,
            ("sft.trajectories_per_step", "sft.trajectories_per_micro_batch"),
            f"sft.trajectories_per_step={sft.trajectories_per_step} is not divisible by "
            f"sft.trajectories_per_micro_batch={sft.trajectories_per_micro_batch}",
        ),
        (
            cfg.algorithm.use_pf_ppo
            and cfg.cluster.backend == "ray"
            and cfg.cluster.transfer_queue_units > 0,
            ("algorithm.use_pf_ppo", "cluster.backend", "cluster.transfer_queue_units"),
            "PF-PPO draws rows more than once, and a TransferQueue row key must be unique: set "
            "cluster.transfer_queue_units=0 (batches through the controller) on Ray",
        ),
    ]
    return [ConfigProblem(keys, message) for fails, keys, message in checks if fails]


ENGINE_RANGES: dict[str, Rule] = {
    "actor.max_tokens_per_micro_batch": NULL_OR_POSITIVE,
    "actor.logit_chunk_size": NULL_OR_POSITIVE,
    "actor.lora.rank": NON_NEGATIVE,
    "actor.lora.alpha": POSITIVE,
    "reference.max_tokens_per_micro_batch": NULL_OR_POSITIVE,
    "reference.logit_chunk_size": NULL_OR_POSITIVE,
    "critic.max_tokens_per_micro_batch": NULL_OR_POSITIVE,
}


def _engine_problems(cfg: RunConfig) -> list[ConfigProblem]:
    """Token budgets, logit chunks and LoRA settings of the training engine (layouts are `choices`)."""
    problems = [
        ConfigProblem((key,), f"must be {requirement}, got {get_by_key(cfg, key)!r}")
        for key, (holds, requirement) in ENGINE_RANGES.items()
        if not holds(get_by_key(cfg, key))
    ]
    targets = cfg.actor.lora.target_modules
    names = isinstance(targets, list) and targets and all(isinstance(t, str) and t for t in targets)
    if targets != "all-linear" and not names:
        message = (
            f"must be all-linear or a non-empty list of module names like [q_proj, v_proj], got {targets!r}"
        )
        problems.append(ConfigProblem(("actor.lora.target_modules",), message))
    longest = cfg.data.max_prompt_tokens + cfg.rollout.max_response_tokens  # one trajectory: P + T
    for role in ("actor", "reference", "critic"):
        budget = get_by_key(cfg, f"{role}.max_tokens_per_micro_batch")
        if budget is not None and 0 < budget < longest:
            keys = (
                f"{role}.max_tokens_per_micro_batch",
                "data.max_prompt_tokens",
                "rollout.max_response_tokens",
            )
            message = f"a budget of {budget} tokens cannot hold one trajectory of up to {longest} tokens"
            problems.append(ConfigProblem(keys, message))
    return problems


def _path_problems(cfg: RunConfig) -> list[ConfigProblem]:
    """Data files, model directories and the custom scorer that must exist on disk."""
    problems = []
    if not cfg.data.train_files:
        problems.append(ConfigProblem(("data.train_files",), "no training data: give parquet files"))
    for key in ("data.train_files", "data.val_files", "sft.train_files"):
        problems += [
            ConfigProblem((key,), f"file not found: {path}")
            for path in get_by_key(cfg, key)
            if not Path(path).is_file()
        ]
    if not cfg.model.path:
        problems.append(ConfigProblem(("model.path",), "no model: give an HF model directory"))
    models = {
        "model.path": True,
        "reference.model_path": cfg.uses_reference,
        "critic.model_path": cfg.uses_critic,
        "distillation.teacher_model_path": cfg.distillation.enabled,
        "reward.model.path": cfg.reward.model.enable,
    }
    for key, needed in models.items():
        path = get_by_key(cfg, key)
        if needed and path:
            problems += model_dir_problems(key, path)
    if cfg.distillation.enabled:
        for source, path in cfg.distillation.teachers.items():
            problems += model_dir_problems(f"distillation.teachers.{source}", path) if path else []
    rm = cfg.reward.model
    tokenizers = [  # (key, its value, the model directory read when it is empty)
        ("model.tokenizer_path", cfg.model.tokenizer_path, ("model.path", cfg.model.path)),
        (
            "reward.model.tokenizer_path",
            rm.tokenizer_path if rm.enable else "",
            ("reward.model.path", rm.path if rm.enable else ""),
        ),
    ]
    for key, path, (model_key, model_path) in tokenizers:
        if path:
            problems += tokenizer_dir_problems(key, path)
        elif model_path and Path(model_path).is_dir():  # not found is reported for the model already
            problems += tokenizer_dir_problems(model_key, model_path, because=f"{key} is empty")
    scorer = cfg.reward.custom_function_path
    if scorer and not Path(scorer).is_file():
        problems.append(ConfigProblem(("reward.custom_function_path",), f"file not found: {scorer}"))
    resume = cfg.trainer.resume_from_path
    if cfg.trainer.resume_mode == "resume_path" and not (resume and Path(resume).is_dir()):
        message = f"resume_mode=resume_path needs an existing global_step_N directory, got {resume!r}"
        problems.append(ConfigProblem(("trainer.resume_mode", "trainer.resume_from_path"), message))
    return problems


def config_warnings(cfg: RunConfig) -> list[str]:
    """Settings that run but are probably unintended, one sentence each naming the keys."""
    return [warning.message for warning in keyed_warnings(cfg)]


def keyed_warnings(cfg: RunConfig) -> list[ConfigProblem]:
    """`config_warnings` with the keys each one concerns, so that a command reading only some keys
    prints only the warnings about those (`sft_scope.sft_warnings`)."""
    inputs, val, loss = _estimator_inputs(cfg), cfg.rollout.val_kwargs, cfg.actor.policy_loss
    forced = catalog.POLICY_LOSS_AGGREGATION[loss.name]
    checks = [  # (fires, keys, message)
        (
            cfg.uses_critic and "values" not in inputs,
            ("critic.enable", "algorithm.adv_estimator"),
            f"critic.enable: a critic is trained but {cfg.algorithm.adv_estimator!r} ignores values",
        ),
        (
            cfg.actor.use_kl_loss and cfg.algorithm.use_kl_in_reward,
            ("actor.use_kl_loss", "algorithm.use_kl_in_reward"),
            "actor.use_kl_loss and algorithm.use_kl_in_reward are both on: the KL is penalized twice",
        ),
        (
            val.greedy and val.n > 1,
            ("rollout.val_kwargs.n", "rollout.val_kwargs.greedy"),
            "rollout.val_kwargs.n > 1 with greedy decoding gives identical samples",
        ),
        (
            cfg.rollout.temperature == 0 and "group" in inputs,
            ("rollout.temperature", "algorithm.adv_estimator"),
            "rollout.temperature=0: the n samples of a prompt are identical and group advantages 0",
        ),
        (
            (cfg.trainer.test_freq > 0 or cfg.trainer.val_before_train) and not cfg.data.val_files,
            ("trainer.test_freq", "trainer.val_before_train", "data.val_files"),
            "trainer.test_freq / trainer.val_before_train ask for validation, but data.val_files is empty",
        ),
        (
            cfg.reward.in_process,
            ("reward.in_process",),
            "reward.in_process=true: scorers run in the trainer's process without a deadline; one that "
            "hangs, exits or crashes stops the run",
        ),
        (
            cfg.algorithm.use_pf_ppo and cfg.algorithm.adv_estimator != "gae",
            ("algorithm.use_pf_ppo", "algorithm.adv_estimator"),
            f"algorithm.use_pf_ppo=true resamples the batch with {cfg.algorithm.adv_estimator!r}; verl 0.9.1 "
            "applies PF-PPO only with gae and ignores it for other estimators",
        ),
        (
            bool(forced) and forced != cfg.actor.loss_agg_mode,
            ("actor.loss_agg_mode", "actor.policy_loss.name"),
            f"actor.loss_agg_mode={cfg.actor.loss_agg_mode!r} is ignored: policy loss {loss.name!r} "
            f"always aggregates with {forced!r} (as in verl)",
        ),
    ]
    return [*async_warnings(cfg), *(ConfigProblem(keys, message) for fires, keys, message in checks if fires)]
