"""Layer 1, config: how verl's keys outside the policy — `data`, `trainer`, `algorithm`, `critic`,
the cluster and the rest — translate to ours, have no effect here, or are refused; `reward*` keys
have no effect or are refused here, and translate in `verl_table_reward`."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from stratarl.config.verl_args import VerlArgs
from stratarl.config.verl_rules import (
    NoEffect,
    NoVerlForm,
    Refused,
    RefusedValue,
    Translation,
    dtype_back,
    file_list,
    layout,
    layout_back,
    micro_batch,
    mixed_dtype,
    none_if_empty,
    text_or_empty,
    token_budget,
    token_budget_back,
    warmup_steps,
    world_size,
)

C, AL, T = "critic", "algorithm", "trainer"
A = "actor_rollout_ref.actor"
LOGGERS = ("console", "wandb", "tensorboard")


def _t(ours: str, *reads: str, compute: Any = None, how: str = "", back: Any = None) -> Translation:
    return Translation(ours, reads, compute, how, back=back)


def _device(args: VerlArgs) -> str:
    device = args.value(f"{T}.device")
    if device not in ("cuda", "cpu"):
        raise RefusedValue(f"device {device!r} is not built here", f"{T}.device=cuda or cpu")
    return "auto" if device == "cuda" else "cpu"


def _logger(args: VerlArgs) -> list[str]:
    value = args.value(f"{T}.logger")
    names = [value] if isinstance(value, str) else list(value or [])
    unknown = [name for name in names if name not in LOGGERS]
    if unknown:
        raise RefusedValue(f"loggers {unknown} are not built here", f"{T}.logger=[console,wandb,tensorboard]")
    return [*names, "jsonl"]  # metrics.jsonl is the run's own record, written always


def _trainer_mode(args: VerlArgs) -> str:
    mode = args.value(f"{T}.v1.trainer_mode")
    if mode != "sync":
        raise RefusedValue(
            f"verl's v1 {mode!r} loop is not built here", "our trainer.mode=one_step_off or async"
        )
    return "sync"


def _trainer_mode_back(mode: str, cfg: Any) -> dict[str, Any]:
    if mode != "sync":
        raise NoVerlForm(
            "verl's main_ppo trains synchronously; its one-step-off and fully async trainers are "
            "separate programs (recipe/one_step_off_policy, recipe/fully_async_policy)"
        )
    return {f"{T}.v1.trainer_mode": "sync"}


def _backend_back(backend: str, cfg: Any) -> dict[str, Any]:
    """verl runs every job on Ray; our in-process backend is one training process, which a verl run
    of one GPU is."""
    return {}


def _gpus_per_worker(args: VerlArgs) -> float:
    if args.value(f"{T}.device") != "cuda" or world_size(args) <= 1:
        return 0.0
    return 1.0 if args.value("ray_kwargs.ray_init.address") or _machine_has_gpus() else 0.0


def _machine_has_gpus() -> bool:
    """NVIDIA GPUs visible to this process, seen without importing torch."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return any(re.fullmatch(r"nvidia\d+", p.name) for p in Path("/dev").glob("nvidia*"))


def _filter_metric(args: VerlArgs) -> str:
    metric = args.value(f"{AL}.filter_groups.metric")
    return "score" if metric in ("reward", "score", "seq_reward", "seq_final_reward") else str(metric)


def _transfer_units(args: VerlArgs) -> int:
    units = "transfer_queue.backend.SimpleStorage.num_data_storage_units"
    return int(args.value(units)) if args.value("transfer_queue.enable") else 0


def _critic_grad_clip(args: VerlArgs) -> float:
    return float(
        args.value(f"{C}.optim.clip_grad" if args.is_given(f"{C}.optim.clip_grad") else f"{C}.grad_clip")
    )


WORLD = "trainer.n_gpus_per_node × trainer.nnodes training processes (FSDP2 ranks)"
TRANSLATIONS = [
    _t(
        "data.train_files", "data.train_files", compute=file_list("data.train_files"), how="one file → [file]"
    ),
    _t("data.val_files", "data.val_files", compute=file_list("data.val_files"), how="one file → [file]"),
    _t("data.prompt_key", "data.prompt_key"),
    _t("data.data_source_key", "data.reward_fn_key"),
    _t("data.max_prompt_tokens", "data.max_prompt_length", how="tokens after the chat template, as verl's"),
    _t("data.filter_overlong", "data.filter_overlong_prompts"),
    _t(
        "data.prompts_per_step",
        "data.train_batch_size",
        how="prompts per step, as verl's (×rollout.n trajectories)",
    ),
    _t("data.max_train_prompts", "data.train_max_samples"),
    _t("data.max_val_prompts", "data.val_max_samples"),
    _t("data.shuffle", "data.shuffle"),
    _t(
        "data.seed",
        "data.seed",
        how="null: verl's sampler is unseeded (another order each launch); ours follows trainer.seed",
    ),
    _t(
        "trainer.seed",
        "actor_rollout_ref.rollout.seed",
        how="the rollout's seed (verl seeds sampling with it, replica rank added) seeds everything here: "
        "sampling, the actor's mini-batch shuffle, initialisation",
    ),
    _t("trainer.total_steps", f"{T}.total_training_steps"),
    _t("trainer.total_epochs", f"{T}.total_epochs"),
    _t("trainer.test_freq", f"{T}.test_freq", how="-1 → never, as ours (≤ 0)"),
    _t("trainer.save_freq", f"{T}.save_freq", how="-1 → never, as ours (≤ 0)"),
    _t("trainer.resume_mode", f"{T}.resume_mode"),
    _t(
        "trainer.resume_from_path",
        f"{T}.resume_from_path",
        compute=text_or_empty(f"{T}.resume_from_path"),
        back=none_if_empty(f"{T}.resume_from_path"),
    ),
    _t("trainer.max_checkpoints_to_keep", f"{T}.max_actor_ckpt_to_keep"),
    _t("trainer.val_before_train", f"{T}.val_before_train"),
    _t("trainer.val_only", f"{T}.val_only"),
    _t(
        "trainer.run_dir",
        f"{T}.default_local_dir",
        how="the run directory holds the checkpoints, as verl's default_local_dir, and everything else",
    ),
    _t("trainer.project_name", f"{T}.project_name"),
    _t("trainer.experiment_name", f"{T}.experiment_name"),
    _t(
        "trainer.logger",
        f"{T}.logger",
        compute=_logger,
        how="metrics.jsonl is written besides, always (ours: jsonl)",
        back=lambda names, cfg: {f"{T}.logger": [name for name in names if name != "jsonl"]},
    ),
    _t("trainer.mode", f"{T}.v1.trainer_mode", compute=_trainer_mode, back=_trainer_mode_back),
    _t("critic.warmup_training_steps", f"{T}.critic_warmup"),
    _t(
        "cluster.training_workers",
        f"{T}.n_gpus_per_node",
        f"{T}.nnodes",
        compute=world_size,
        how=WORLD,
        back=lambda workers, cfg: {f"{T}.n_gpus_per_node": workers, f"{T}.nnodes": 1},
    ),
    _t(
        "cluster.backend",
        f"{T}.n_gpus_per_node",
        f"{T}.nnodes",
        compute=lambda a: "ray" if world_size(a) > 1 else "in-process",
        how="more than one process: Ray, else this process",
        back=_backend_back,
    ),
    _t(
        "cluster.device",
        f"{T}.device",
        compute=_device,
        how="cuda → auto (CUDA where this machine has it, else cpu)",
        back=lambda device, cfg: {f"{T}.device": "cpu" if device == "cpu" else "cuda"},
    ),
    _t(
        "cluster.gpus_per_training_worker",
        f"{T}.device",
        f"{T}.n_gpus_per_node",
        f"{T}.nnodes",
        "ray_kwargs.ray_init.address",
        compute=_gpus_per_worker,
        how="device cuda and more than one process: 1 GPU each where this machine has NVIDIA GPUs or "
        "ray_init.address names a cluster; else 0 (CPU processes)",
        back=lambda gpus, cfg: {},  # follows trainer.device and the machine
    ),
    _t("cluster.num_cpus", "ray_kwargs.ray_init.num_cpus"),
    _t("cluster.address", "ray_kwargs.ray_init.address"),
    _t(
        "cluster.transfer_queue_units",
        "transfer_queue.enable",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units",
        compute=_transfer_units,
        how="enable=false → 0 (batches through the controller), else its storage units",
        back=lambda units, cfg: (
            {"transfer_queue.enable": units > 0}
            | ({"transfer_queue.backend.SimpleStorage.num_data_storage_units": units} if units > 0 else {})
        ),
    ),
    _t("algorithm.adv_estimator", f"{AL}.adv_estimator"),
    _t("algorithm.gamma", f"{AL}.gamma"),
    _t("algorithm.lam", f"{AL}.lam"),
    _t("algorithm.norm_adv_by_std", f"{AL}.norm_adv_by_std_in_grpo"),
    _t("algorithm.use_kl_in_reward", f"{AL}.use_kl_in_reward"),
    _t("algorithm.use_pf_ppo", f"{AL}.use_pf_ppo"),
    _t("algorithm.pf_ppo.reweight_method", f"{AL}.pf_ppo.reweight_method"),
    _t("algorithm.pf_ppo.weight_pow", f"{AL}.pf_ppo.weight_pow"),
    _t("algorithm.kl_penalty", f"{AL}.kl_penalty"),
    *[_t(f"algorithm.kl_ctrl.{k}", f"{AL}.kl_ctrl.{k}") for k in ("type", "kl_coef", "target_kl", "horizon")],
    _t("algorithm.filter_groups.enable", f"{AL}.filter_groups.enable"),
    _t(
        "algorithm.filter_groups.metric",
        f"{AL}.filter_groups.metric",
        compute=_filter_metric,
        how="reward, score, seq_reward, seq_final_reward → score; a scorer's key (acc) as it is",
    ),
    _t(
        "algorithm.filter_groups.max_num_gen_batches",
        f"{AL}.filter_groups.max_num_gen_batches",
        how="0: no cap, as verl's",
    ),
    *[
        _t(f"algorithm.rollout_correction.{k}", f"{AL}.rollout_correction.{k}")
        for k in (
            "rollout_is",
            "rollout_is_threshold",
            "rollout_is_batch_normalize",
            "rollout_rs",
            "rollout_rs_threshold",
            "bypass_mode",
            "loss_type",
        )
    ],
    _t("critic.enable", f"{C}.enable"),
    _t(
        "critic.model_path",
        f"{C}.model.path",
        compute=lambda a: a.value(f"{C}.model.path") if a.is_given(f"{C}.model.path") else "",
        how="not given: '' (the policy's model; verl's default is a placeholder path)",
        back=lambda path, cfg: {f"{C}.model.path": path or "${actor_rollout_ref.model.path}"},
    ),
    _t("critic.lr", f"{C}.optim.lr"),
    _t("critic.weight_decay", f"{C}.optim.weight_decay"),
    _t(
        "critic.warmup_steps",
        f"{C}.optim.lr_warmup_steps",
        f"{C}.optim.lr_warmup_steps_ratio",
        compute=warmup_steps(f"{C}.optim.lr_warmup_steps", f"{C}.optim.lr_warmup_steps_ratio"),
    ),
    _t("critic.grad_clip", f"{C}.grad_clip", f"{C}.optim.clip_grad", compute=_critic_grad_clip),
    _t(
        "critic.prompts_per_mini_batch",
        f"{C}.ppo_mini_batch_size",
        how="prompts, as verl's (follows the actor's)",
    ),
    _t(
        "critic.trajectories_per_micro_batch",
        f"{C}.ppo_micro_batch_size_per_gpu",
        f"{C}.ppo_micro_batch_size",
        compute=micro_batch(
            "critic",
            f"{C}.ppo_mini_batch_size",
            f"{C}.ppo_micro_batch_size_per_gpu",
            f"{C}.ppo_micro_batch_size",
        ),
        how="per worker, as the actor's",
    ),
    _t(
        "critic.max_tokens_per_micro_batch",
        f"{C}.use_dynamic_bsz",
        f"{C}.ppo_max_token_len_per_gpu",
        compute=token_budget(f"{C}.use_dynamic_bsz", f"{C}.ppo_max_token_len_per_gpu"),
        back=token_budget_back(f"{C}.use_dynamic_bsz", f"{C}.ppo_max_token_len_per_gpu"),
    ),
    _t(
        "critic.layout",
        f"{C}.model.use_remove_padding",
        compute=layout(f"{C}.model.use_remove_padding"),
        how="true → packed",
        back=layout_back(f"{C}.model.use_remove_padding"),
    ),
    _t("critic.gradient_checkpointing", f"{C}.model.enable_gradient_checkpointing"),
    _t("critic.ppo_epochs", f"{C}.ppo_epochs"),
    _t("critic.cliprange_value", f"{C}.cliprange_value"),
    _t("critic.loss_agg_mode", f"{C}.loss_agg_mode"),
    _t(
        "critic.fsdp.param_dtype",
        f"{C}.fsdp.dtype",
        compute=lambda a: mixed_dtype(a.value(f"{C}.fsdp.dtype")),
        how="fp32 → null",
        back=dtype_back(f"{C}.fsdp.dtype"),
    ),
    _t("critic.fsdp.offload_params", f"{C}.fsdp.param_offload"),
    _t("critic.fsdp.reshard_after_forward", f"{C}.fsdp.reshard_after_forward"),
]

NO_EFFECT = [
    NoEffect(
        (
            "data.use_shm",
            "data.dataloader_num_workers",
            "data.filter_overlong_prompts_workers",
            "data.val_batch_size",
            "data.validation_shuffle",
            f"{C}.fsdp.*",
            f"{C}.forward_max_token_len_per_gpu",
            f"{C}.forward_micro_batch_size*",
            f"{C}.data_loader_seed",
            f"{C}.rollout_n",
            f"{C}.shuffle",
            f"{C}.model.use_shm",
            f"{C}.model.enable_activation_offload",
            f"{C}.model.use_liger",
            f"{C}.model.use_fused_kernels",
            f"{C}.model.fused_kernel_options.*",
            f"{C}.model.tiled_mlp.*",
            f"{C}.model.lora.*",
            f"{C}.checkpoint.*",
            f"{C}.loss_scale_factor",
            f"{T}.balance_batch",
            f"{T}.esi_redundant_time",
            f"{T}.ray_wait_register_center_timeout",
            f"{T}.use_v1",
            "ray_kwargs.ray_init.runtime_env.*",
            "ray_kwargs.timeline_json_file",
            "transfer_queue.metrics.*",
            "transfer_queue.backend.SimpleStorage.total_storage_size",
            "transfer_queue.backend.MooncakeStore.*",
        ),
        "a memory, speed or load-balance knob, or one that follows a translated key: it changes no number "
        "a run computes here",
    ),
    NoEffect(
        (
            "data.return_raw_input_ids",
            "data.return_raw_chat",
            "data.return_full_prompt",
            "data.tool_config_path",
            "data.function_tool_path",
            "data.trust_remote_code",
            "data.image_patch_size",
            "data.image_key",
            "data.video_key",
            "data.audio_key",
            "data.return_multi_modal_inputs",
            "data.mm_processor_kwargs*",
        ),
        "how verl's dataset hands prompts to its workers (raw chat, multi-modal columns, copies of the "
        "multi-turn tool paths): prompts here keep their messages; text only",
    ),
    NoEffect(
        (
            f"{T}.log_val_generations",
            f"{T}.rollout_data_dir",
            f"{T}.validation_data_dir",
            "global_profiler.*",
            f"{C}.profiler.*",
        ),
        "always recorded: every trajectory (trajectories.jsonl, traces/) and every validation generation "
        "are written into the run directory; phases are timed in metrics.jsonl",
    ),
    NoEffect(
        (
            "reward.reward_model.enable_resource_pool",
            "reward.reward_model.n_gpus_per_node",
            "reward.reward_model.nnodes",
            "reward.reward_model.rollout.*",
            "reward_model.*",
        ),
        "how verl serves its reward model (GPUs, inference engine), and the legacy reward_model.* keys "
        "(superseded by reward.reward_model.*): our reward model runs in the reward worker (reward.model.*)",
    ),
    NoEffect(("*._target_",), "the dataclass verl builds from this group"),
]

NOT_HERE = "the default"
REFUSED = [
    Refused(
        (f"{C}.strategy",),
        "Megatron-LM is not built here",
        "strategy=fsdp or fsdp2",
        allowed=("fsdp", "fsdp2"),
    ),
    Refused(
        (f"{C}.ulysses_sequence_parallel_size",),
        "sequence parallelism (Ulysses) is not built here",
        "critic.use_dynamic_bsz with ppo_max_token_len_per_gpu",
    ),
    Refused(
        (f"{C}.optim.*", f"{C}.model.*"),
        "the critic here has its own lr, weight decay, warm-up and grad clip; the rest (betas, schedule, "
        "dtype, LoRA, tokenizer) follows the actor's model",
        "critic.optim.lr, weight_decay, lr_warmup_steps, critic.grad_clip; critic.model.path",
    ),
    Refused(
        (
            "data.tokenizer",
            "data.custom_cls.*",
            "data.apply_chat_template_kwargs*",
            "data.gen_batch_size",
            "data.truncation",
        ),
        "prompts here are verl-schema parquet rows rendered with the model's own tokenizer and chat "
        "template, never truncated; dynamic sampling generates rounds of data.train_batch_size prompts",
        "actor_rollout_ref.model.tokenizer_path; data.filter_overlong_prompts=true drops long prompts",
    ),
    Refused(
        (
            f"{T}.checkpoint_callback_class",
            f"{T}.default_hdfs_dir",
            f"{T}.del_local_ckpt_after_load",
            f"{T}.max_critic_ckpt_to_keep",
        ),
        "checkpoints here are local, kept whole (actor and critic together), with no callback",
        f"{T}.max_actor_ckpt_to_keep (counts whole checkpoints)",
    ),
    Refused(
        (f"{T}.v1.sync*", f"{T}.v1.colocate_async.*", f"{T}.v1.separate_async.*", f"{T}.v1.sampler.*"),
        "verl's v1 asynchronous loops are not built here",
        "trainer.mode=async and async_training.* of `stratarl train` (docs/async.md)",
    ),
    Refused(
        (f"{AL}.filter_groups.max_inflight_gen_batches",),
        "generation rounds of dynamic sampling run one at a time here",
        NOT_HERE,
    ),
    Refused(
        ("reward.reward_manager.*",),
        "the reward here is a rule scorer per data source (verl's naive manager), with DAPO's overlong "
        "buffer as reward.overlong_buffer.*",
        "reward.custom_reward_function.path/name",
        allowed=("dapo",),
    ),
    Refused(
        ("reward.sandbox_fusion.*", "sandbox_fusion.*"),
        "code is scored in our own bubblewrap sandbox, not a SandboxFusion server",
        "docs/rewards.md#the-sandbox",
    ),
    Refused(
        ("skip.*",),
        "dumping and replaying rollouts is not built here",
        "stratarl trace RUN reads every step's trajectories",
    ),
    Refused(
        ("transfer_queue.backend.storage_backend",),
        "the TransferQueue here stores rows in its own storage units",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units",
    ),
]
