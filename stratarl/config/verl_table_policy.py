"""Layer 1, config: how verl's `actor_rollout_ref.*` keys (the policy: model, actor, reference,
rollout, multi-turn) translate to ours, have no effect here, or are refused (`verl_rules`)."""

from __future__ import annotations

from typing import Any

from stratarl.config.verl_args import VerlArgs
from stratarl.config.verl_rules import (
    NoEffect,
    Refused,
    RefusedValue,
    Translation,
    dtype_back,
    dtype_name,
    layout,
    layout_back,
    micro_batch,
    mixed_dtype,
    none_if_empty,
    scheduler,
    text_or_empty,
    token_budget,
    token_budget_back,
    vllm_installed,
    warmup_steps,
)

A, R, M = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.model"
REF, MT = "actor_rollout_ref.ref", "actor_rollout_ref.rollout.multi_turn"


def _rollout_backend(args: VerlArgs) -> str:
    name = args.value(f"{R}.name")
    if name == "sglang":
        raise RefusedValue(
            "SGLang is not available in this build",
            f"{R}.name=vllm (with vLLM installed), else our torch engine",
        )
    if name == "vllm" and vllm_installed():
        return "vllm"
    if name in (None, "vllm", "hf"):
        return "torch"
    raise RefusedValue(f"rollout engine {name!r} is unknown here", f"{R}.name=vllm or hf")


def _val_greedy(args: VerlArgs) -> bool:
    return (
        not args.value(f"{R}.val_kwargs.do_sample") or float(args.value(f"{R}.val_kwargs.temperature")) == 0
    )


def _val_temperature(args: VerlArgs) -> float:
    temperature = float(args.value(f"{R}.val_kwargs.temperature"))
    return temperature if temperature > 0 else 1.0  # greedy: ours reads no temperature


def _val_greedy_back(greedy: bool, cfg: Any) -> dict[str, Any]:
    """Sampling validation needs do_sample and a temperature above 0 (verl's 0 means greedy)."""
    if greedy:
        return {f"{R}.val_kwargs.do_sample": False}
    temperature = cfg.rollout.val_kwargs.temperature
    return {f"{R}.val_kwargs.do_sample": True, f"{R}.val_kwargs.temperature": temperature}


def _clip(bound: str) -> Any:
    """clip_ratio_low/high; the older clip_ratio where only it was given."""

    def clip(args: VerlArgs) -> float:
        if args.is_given(f"{A}.clip_ratio") and not args.is_given(f"{A}.{bound}"):
            return float(args.value(f"{A}.clip_ratio"))
        return float(args.value(f"{A}.{bound}"))

    return clip


def _grad_clip(args: VerlArgs) -> float:
    key = f"{A}.optim.clip_grad" if args.is_given(f"{A}.optim.clip_grad") else f"{A}.grad_clip"
    return float(args.value(key))


def _truncate_side(args: VerlArgs) -> str:
    side = args.value(f"{MT}.tool_response_truncate_side")
    return {"left": "head", "right": "tail", "middle": "middle"}.get(side, side)


_VERL_SIDES = {"head": "left", "tail": "right"}


def _reference_micro(args: VerlArgs) -> int:
    per_gpu = args.value(f"{REF}.log_prob_micro_batch_size_per_gpu")
    if per_gpu is not None:
        return int(per_gpu)
    return micro_batch("actor", f"{A}.ppo_mini_batch_size", f"{A}.ppo_micro_batch_size_per_gpu",
                       f"{A}.ppo_micro_batch_size")(args)  # fmt: skip


def _t(ours: str, *reads: str, compute: Any = None, how: str = "", back: Any = None) -> Translation:
    return Translation(ours, reads, compute, how, back=back)


PER_GPU = (
    "trajectories per worker: verl's per-GPU size as it is; the global ppo_micro_batch_size ÷ GPUs; "
    "neither: the worker's whole mini-batch"
)
TRANSLATIONS = [
    _t("model.path", f"{M}.path"),
    _t(
        "model.tokenizer_path",
        f"{M}.tokenizer_path",
        compute=text_or_empty(f"{M}.tokenizer_path"),
        back=none_if_empty(f"{M}.tokenizer_path"),
    ),
    _t("model.trust_remote_code", f"{M}.trust_remote_code"),
    _t("model.gradient_checkpointing", f"{M}.enable_gradient_checkpointing"),
    _t(
        "model.dtype",
        f"{A}.fsdp_config.model_dtype",
        compute=lambda a: dtype_name(a.value(f"{A}.fsdp_config.model_dtype")),
        how="fp32 → float32, bf16 → bfloat16",
        back=dtype_back(f"{A}.fsdp_config.model_dtype"),
    ),
    _t("actor.lora.rank", f"{M}.lora_rank"),
    _t("actor.lora.alpha", f"{M}.lora_alpha", compute=lambda a: float(a.value(f"{M}.lora_alpha"))),
    _t("actor.lora.target_modules", f"{M}.target_modules"),
    _t(
        "actor.layout",
        f"{A}.use_remove_padding",
        f"{M}.use_remove_padding",
        compute=layout(f"{A}.use_remove_padding"),
        how="true → packed, false → padded",
        back=layout_back(f"{A}.use_remove_padding"),
    ),
    _t(
        "reference.layout",
        f"{M}.use_remove_padding",
        compute=layout(f"{M}.use_remove_padding"),
        how="true → packed, false → padded",
        back=layout_back(f"{M}.use_remove_padding"),
    ),
    _t(
        "rollout.backend",
        f"{R}.name",
        compute=_rollout_backend,
        how="vllm → vllm where vLLM is installed, else our torch engine (the same sampling); "
        "hf or not given → torch; sglang refused",
        back=lambda backend, cfg: {f"{R}.name": "vllm"},  # verl's engine; ours samples as it does
    ),
    _t("rollout.n", f"{R}.n"),
    _t("rollout.temperature", f"{R}.temperature", compute=lambda a: float(a.value(f"{R}.temperature"))),
    _t("rollout.top_p", f"{R}.top_p", compute=lambda a: float(a.value(f"{R}.top_p"))),
    _t("rollout.top_k", f"{R}.top_k"),
    _t(
        "rollout.max_response_tokens",
        f"{R}.response_length",
        "data.max_response_length",
        compute=lambda a: int(a.value(f"{R}.response_length")),
        how="tokens, as verl's (the rollout's response_length follows data.max_response_length)",
        back=lambda tokens, cfg: {"data.max_response_length": tokens},
    ),
    _t("rollout.ignore_eos", f"{R}.ignore_eos"),
    _t(
        "rollout.dtype",
        f"{R}.dtype",
        compute=lambda a: dtype_name(a.value(f"{R}.dtype")),
        back=dtype_back(f"{R}.dtype"),
    ),
    _t("rollout.free_cache_engine", f"{R}.free_cache_engine"),
    _t(
        "rollout.trajectories_per_generate_batch",
        f"{R}.max_num_seqs",
        how="sequences decoded together, as vLLM's max_num_seqs",
    ),
    _t("rollout.val_kwargs.n", f"{R}.val_kwargs.n"),
    _t(
        "rollout.val_kwargs.greedy",
        f"{R}.val_kwargs.do_sample",
        f"{R}.val_kwargs.temperature",
        compute=_val_greedy,
        how="greedy = not do_sample, or temperature 0",
        back=_val_greedy_back,
    ),
    _t(
        "rollout.val_kwargs.temperature",
        f"{R}.val_kwargs.temperature",
        compute=_val_temperature,
        how="0 (greedy) → 1.0, unused",
    ),
    _t(
        "rollout.val_kwargs.top_p",
        f"{R}.val_kwargs.top_p",
        compute=lambda a: float(a.value(f"{R}.val_kwargs.top_p")),
    ),
    _t("rollout.val_kwargs.top_k", f"{R}.val_kwargs.top_k"),
    _t("agent.enable", f"{MT}.enable"),
    _t("agent.default_agent", f"{R}.agent.default_agent_loop"),
    _t(
        "agent.tool_config_path",
        f"{MT}.tool_config_path",
        compute=text_or_empty(f"{MT}.tool_config_path"),
        back=none_if_empty(f"{MT}.tool_config_path"),
    ),
    _t(
        "agent.interaction_config_path",
        f"{MT}.interaction_config_path",
        compute=text_or_empty(f"{MT}.interaction_config_path"),
        back=none_if_empty(f"{MT}.interaction_config_path"),
    ),
    _t("agent.max_assistant_turns", f"{MT}.max_assistant_turns"),
    _t("agent.max_user_turns", f"{MT}.max_user_turns"),
    _t("agent.tool_format", f"{MT}.format"),
    _t("agent.max_parallel_calls", f"{MT}.max_parallel_calls"),
    _t("agent.max_tool_response_chars", f"{MT}.max_tool_response_length", how="characters, as verl's"),
    _t(
        "agent.truncate_side",
        f"{MT}.tool_response_truncate_side",
        compute=_truncate_side,
        how="left → head, right → tail",
        back=lambda side, cfg: {f"{MT}.tool_response_truncate_side": _VERL_SIDES.get(side, side)},
    ),
    _t("actor.lr", f"{A}.optim.lr"),
    _t("actor.weight_decay", f"{A}.optim.weight_decay"),
    _t("actor.betas", f"{A}.optim.betas"),
    _t(
        "actor.warmup_steps",
        f"{A}.optim.lr_warmup_steps",
        f"{A}.optim.lr_warmup_steps_ratio",
        compute=warmup_steps(f"{A}.optim.lr_warmup_steps", f"{A}.optim.lr_warmup_steps_ratio"),
        how="training steps (one scheduler step per update, as verl); "
        "-1: ratio × trainer.total_training_steps",
    ),
    _t(
        "actor.lr_schedule",
        f"{A}.optim.lr_scheduler_type",
        f"{A}.optim.warmup_style",
        compute=scheduler(f"{A}.optim.lr_scheduler_type", f"{A}.optim.warmup_style"),
    ),
    _t("actor.min_lr_ratio", f"{A}.optim.min_lr_ratio"),
    _t("actor.grad_clip", f"{A}.grad_clip", f"{A}.optim.clip_grad", compute=_grad_clip),
    _t(
        "actor.prompts_per_mini_batch",
        f"{A}.ppo_mini_batch_size",
        how="prompts per mini-batch, as verl's (×rollout.n trajectories)",
    ),
    _t(
        "actor.trajectories_per_micro_batch",
        f"{A}.ppo_micro_batch_size_per_gpu",
        f"{A}.ppo_micro_batch_size",
        compute=micro_batch(
            "actor",
            f"{A}.ppo_mini_batch_size",
            f"{A}.ppo_micro_batch_size_per_gpu",
            f"{A}.ppo_micro_batch_size",
        ),
        how=PER_GPU,
    ),
    _t(
        "actor.max_tokens_per_micro_batch",
        f"{A}.use_dynamic_bsz",
        f"{A}.ppo_max_token_len_per_gpu",
        compute=token_budget(f"{A}.use_dynamic_bsz", f"{A}.ppo_max_token_len_per_gpu"),
        how="tokens per worker when use_dynamic_bsz, else null (rows decide)",
        back=token_budget_back(f"{A}.use_dynamic_bsz", f"{A}.ppo_max_token_len_per_gpu"),
    ),
    _t("actor.ppo_epochs", f"{A}.ppo_epochs"),
    _t("actor.shuffle", f"{A}.shuffle"),
    _t("actor.policy_loss.name", f"{A}.policy_loss.loss_mode"),
    _t(
        "actor.policy_loss.clip_ratio_low",
        f"{A}.clip_ratio_low",
        f"{A}.clip_ratio",
        compute=_clip("clip_ratio_low"),
        how="clip_ratio where only it is given",
    ),
    _t(
        "actor.policy_loss.clip_ratio_high",
        f"{A}.clip_ratio_high",
        compute=_clip("clip_ratio_high"),
        how="clip_ratio where only it is given",
    ),
    _t("actor.policy_loss.clip_ratio_c", f"{A}.clip_ratio_c"),
    _t("actor.policy_loss.tau_pos", f"{A}.tau_pos"),
    _t("actor.policy_loss.tau_neg", f"{A}.tau_neg"),
    *[
        _t(f"actor.policy_loss.{k}", f"{A}.policy_loss.{k}")
        for k in ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef", "dro_beta")
    ],
    _t("actor.loss_agg_mode", f"{A}.loss_agg_mode"),
    _t("actor.loss_scale_factor", f"{A}.loss_scale_factor"),
    _t("actor.entropy_coeff", f"{A}.entropy_coeff", compute=lambda a: float(a.value(f"{A}.entropy_coeff"))),
    _t("actor.use_kl_loss", f"{A}.use_kl_loss"),
    _t("actor.kl_loss_coef", f"{A}.kl_loss_coef"),
    _t("actor.kl_loss_type", f"{A}.kl_loss_type"),
    _t(
        "actor.fsdp.param_dtype",
        f"{A}.fsdp_config.dtype",
        compute=lambda a: mixed_dtype(a.value(f"{A}.fsdp_config.dtype")),
        how="the compute dtype of FSDP mixed precision; fp32 → null",
        back=dtype_back(f"{A}.fsdp_config.dtype"),
    ),
    _t("actor.fsdp.offload_params", f"{A}.fsdp_config.param_offload"),
    _t("actor.fsdp.optimizer_offload", f"{A}.fsdp_config.optimizer_offload"),
    _t("actor.fsdp.reshard_after_forward", f"{A}.fsdp_config.reshard_after_forward"),
    _t(
        "reference.trajectories_per_micro_batch",
        f"{REF}.log_prob_micro_batch_size_per_gpu",
        compute=_reference_micro,
        how="per worker; not given: the actor's",
    ),
    _t(
        "reference.max_tokens_per_micro_batch",
        f"{REF}.log_prob_use_dynamic_bsz",
        f"{REF}.log_prob_max_token_len_per_gpu",
        compute=token_budget(f"{REF}.log_prob_use_dynamic_bsz", f"{REF}.log_prob_max_token_len_per_gpu"),
        back=token_budget_back(f"{REF}.log_prob_use_dynamic_bsz", f"{REF}.log_prob_max_token_len_per_gpu"),
    ),
]

_MEMORY = "a GPU-memory or speed knob: it changes no number a run computes, and our engines size themselves"
_KERNEL = "a kernel choice (fused, compiled or chunked ops): the same numbers, computed by our torch code"
NO_EFFECT = [
    NoEffect(
        (
            "actor_rollout_ref.*profiler.*",
            "actor_rollout_ref.rollout.prometheus.*",
            f"{R}.trace.*",
            f"{R}.disable_log_stats",
            f"{R}.moe_load_balance_metrics_interval",
        ),
        "profiling and serving metrics: stratarl times every phase and its memory peak in metrics.jsonl "
        "and traces every trajectory (trace.*)",
    ),
    NoEffect(
        (
            f"{M}.use_shm",
            f"{M}.enable_activation_offload",
            f"{A}.fsdp_config.offload_policy",
            f"{REF}.fsdp_config.*",
            f"{A}.fsdp_config.wrap_policy.*",
            f"{A}.fsdp_config.fsdp_size",
            f"{A}.fsdp_config.forward_prefetch",
            f"{A}.fsdp_config.use_orig_params",
            f"{A}.fsdp_config.use_no_sync_for_gradient_accumulation",
            f"{A}.fsdp_config.turbo_config.*",
            f"{A}.fsdp_config.forward_only",
            f"{A}.fsdp_config.strategy",
            f"{A}.fsdp_config.pad_to_length*",
            f"{A}.pad_to_length",
            f"{REF}.pad_to_length",
            f"{A}.fsdp_config.entropy_checkpointing",
            f"{A}.entropy_checkpointing",
            f"{REF}.entropy_checkpointing",
        ),
        _MEMORY,
    ),
    NoEffect(
        (
            f"{R}.gpu_memory_utilization",
            f"{R}.enforce_eager",
            f"{R}.cudagraph_capture_sizes",
            f"{R}.tensor_model_parallel_size",
            f"{R}.data_parallel_size",
            f"{R}.expert_parallel_size",
            f"{R}.pipeline_model_parallel_size",
            f"{R}.max_num_batched_tokens",
            f"{R}.max_model_len",
            f"{R}.enable_chunked_prefill",
            f"{R}.enable_prefix_caching",
            f"{R}.scheduling_policy",
            f"{R}.load_format",
            f"{R}.layered_summon",
            f"{R}.multi_stage_wake_up",
            f"{R}.engine_kwargs.*",
            f"{R}.checkpoint_engine.*",
            f"{R}.skip_tokenizer_init",
            f"{R}.mode",
            f"{R}.nnodes",
            f"{R}.n_gpus_per_node",
            f"{R}.prompt_length",
            f"{R}.calculate_log_probs",
            f"{R}.agent.num_workers",
            f"{R}.log_prob_*",
            f"{R}.full_determinism",
            f"{REF}.log_prob_micro_batch_size",
            f"{A}.fsdp_config.full_determinism",
        ),
        "a serving knob of the inference engine (memory, parallel layout, scheduling, weight loading): the "
        "rollout engine here decodes rollout.trajectories_per_generate_batch sequences at a time; the "
        "old-log-prob forward runs on the actor's micro-batches",
    ),
    NoEffect(
        (
            f"{M}.use_liger",
            f"{M}.use_fused_kernels",
            f"{M}.fused_kernel_options.*",
            f"{M}.tiled_mlp.*",
            f"{A}.use_fused_kernels",
            f"{A}.use_torch_compile",
            f"{REF}.use_torch_compile",
            f"{A}.fsdp_config.use_torch_compile",
            f"{A}.use_prefix_grouper",
            f"{A}.entropy_from_logits_with_chunking",
            f"{A}.entropy_from_logits_chunk_size",
            f"{REF}.entropy_from_logits_*",
            f"{A}.fsdp_config.entropy_from_logits_*",
        ),
        _KERNEL,
    ),
    NoEffect(
        (
            f"{A}.rollout_n",
            f"{REF}.rollout_n",
            f"{REF}.strategy",
            f"{REF}.ulysses_sequence_parallel_size",
            f"{A}.fsdp_config.seed",
            f"{A}.data_loader_seed",
            "actor_rollout_ref.hybrid_engine",
            "actor_rollout_ref.nccl_timeout",
        ),
        "follows another key (translated) or the seed: verl copies rollout.n and the strategy into every "
        "role; seeds here derive from trainer.seed (translated from rollout.seed); nccl_timeout: "
        "cluster.call_timeout_s",
    ),
    NoEffect(
        (
            f"{A}.calculate_entropy",
            f"{A}.calculate_sum_pi_squared",
            f"{A}.freeze_vision_tower",
            f"{A}.checkpoint.*",
            f"{M}.lora.*",
            f"{MT}.tokenization_sanity_check_mode",
        ),
        "always on or not applicable: entropy is always logged, a checkpoint always holds model, optimizer "
        "and loop state, our multi-turn tokens are exact by construction, model.lora.* is Megatron's LoRA",
    ),
    NoEffect(("*._target_",), "the dataclass verl builds from this group"),
]

_ONE_WAY = "the default"
REFUSED = [
    Refused(
        (f"{A}.strategy",),
        "Megatron-LM parallelism (tensor, pipeline, expert) is not built here",
        "FSDP2 data parallelism over trainer.n_gpus_per_node × nnodes ranks: strategy=fsdp or fsdp2",
        allowed=("fsdp", "fsdp2"),
    ),
    Refused(
        (f"{A}.ulysses_sequence_parallel_size", f"{A}.fsdp_config.ulysses_sequence_parallel_size"),
        "sequence parallelism (Ulysses) is not built here",
        "a token budget per micro-batch: use_dynamic_bsz=true with ppo_max_token_len_per_gpu",
    ),
    Refused(
        (
            f"{A}.optim.optimizer",
            f"{A}.optim.optimizer_impl",
            f"{A}.optim.override_optimizer_config",
            f"{A}.optim.num_cycles",
            f"{A}.optim.zero_indexed_step",
        ),
        "the optimizer here is torch's AdamW with a linear warm-up then a constant or half-cosine schedule",
        "optim.lr, weight_decay, betas, lr_warmup_steps, lr_scheduler_type=constant|cosine, min_lr_ratio",
    ),
    Refused(
        (f"{A}.optim.total_training_steps",),
        "set by verl's trainer, not by a user",
        "trainer.total_training_steps",
    ),
    Refused(
        (
            f"{A}.qat.*",
            f"{A}.fsdp_config.qat.*",
            f"{R}.qat*",
            f"{R}.quantization",
            f"{R}.quantization_config_file",
        ),
        "quantization (QAT, quantized rollout) is not built here",
        f"full-precision or bf16 weights: {A}.fsdp_config.dtype, {R}.dtype",
    ),
    Refused(
        (f"{M}.mtp.*", f"{R}.mtp*", f"{R}.enable_rollout_routing_replay"),
        "multi-token prediction, speculative decoding and MoE routing replay are not built here",
        _ONE_WAY,
    ),
    Refused(
        (
            f"{M}.custom_chat_template",
            f"{M}.external_lib",
            f"{M}.hf_config_path",
            f"{M}.override_config*",
            f"{M}.exclude_modules",
            f"{M}.lora_adapter_path",
        ),
        "the model is a local HF directory used as it is (its own config and chat template, no extra "
        "library)",
        f"edit the model directory; {M}.target_modules for LoRA",
    ),
    Refused(
        (
            f"{R}.do_sample",
            f"{R}.over_sample_rate",
            f"{R}.logprobs_mode",
            f"{R}.router_config_path",
            f"{R}.disaggregation.*",
        ),
        "training rollouts here always sample, return the log-probs of the sampled tokens after "
        "temperature, and run on one engine per replica",
        f"{R}.temperature, top_p, top_k",
    ),
    Refused(
        (
            f"{MT}.function_tool_path",
            f"{MT}.num_repeat_rollouts",
            f"{MT}.use_inference_chat_template",
            f"{R}.agent.agent_loop_config_path",
            f"{R}.agent.custom_async_server.*",
        ),
        "custom agent loops, function tools and inference-time chat templates are not built here",
        f"tools in a YAML tool config ({MT}.tool_config_path), agent loops tool_agent or single_turn_agent",
    ),
]
