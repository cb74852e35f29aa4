"""Layer 1, config: the roles that generate and learn — `rollout.*`, `actor.*`, `reference.*`, `critic.*`.

Batch sizes say their unit. verl's `ppo_mini_batch_size` counts prompts and its micro-batch sizes
count trajectories; here the names say so: `actor.prompts_per_mini_batch`,
`actor.trajectories_per_micro_batch`. How they combine is printed as the batch plan (batch_plan.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stratarl.config.setting import section, setting

ARF = "actor_rollout_ref"  # verl's prefix for the actor, rollout and reference groups
LR_SCHEDULES = ("constant", "cosine")
LAYOUTS = ("packed", "padded")  # stratarl.engine.packing.LAYOUTS
ADAMW_IMPLS = ("auto", "loop", "foreach", "fused")  # stratarl.engine.optim.ADAMW_IMPLS
ADAMW_IMPL_DOC = (
    "torch kernel of the AdamW step — auto: torch chooses (loop on CPU, foreach on CUDA; the "
    "trajectories of earlier runs); loop: one parameter at a time; foreach: multi-tensor ops, "
    "bit-identical to loop on CPU; fused: one kernel (HF Trainer's and TRL's default), rounded "
    "differently (~1e-7 of the weights after 12 steps). Per step at the 50m preset, 2 CPU threads: "
    "loop 82 ms, foreach 95 ms, fused 29 ms"
)
LOGIT_CHUNK_SIZE = 256  # stratarl.engine.fused_head.LOGIT_CHUNK_SIZE (config does not import the engine)
TOKEN_BUDGET_DOC = "token budget per micro-batch (prompt + response tokens, padding excluded); null: by rows"
LAYOUT_DOC = "packed: rows back to back, no compute on padding; padded: the batch as it is"


@dataclass
class ValidationSamplingConfig:
    """How validation prompts are sampled (verl rollout.val_kwargs)."""

    n: int = setting(1, "samples per validation prompt", verl=f"{ARF}.rollout.val_kwargs.n")
    greedy: bool = setting(
        True,
        "pick the most likely token (temperature, top_p, top_k unused)",
        verl=f"{ARF}.rollout.val_kwargs.do_sample (negated)",
    )
    temperature: float = setting(
        1.0, "sampling temperature when greedy is false", verl=f"{ARF}.rollout.val_kwargs.temperature"
    )
    top_p: float = setting(1.0, "nucleus mass when greedy is false", verl=f"{ARF}.rollout.val_kwargs.top_p")
    top_k: int = setting(
        -1,
        "keep the k likeliest tokens when greedy is false; -1: all",
        verl=f"{ARF}.rollout.val_kwargs.top_k",
    )


@dataclass
class RolloutConfig:
    """Generation of the training trajectories."""

    backend: str = setting(
        "torch",
        "inference engine that generates, in every placement: torch, or vllm (needs vLLM installed: "
        "`make test-vllm` builds .venv-vllm); sglang is not available in this build",
        verl=f"{ARF}.rollout.name",
        choices=("torch", "vllm", "sglang"),
    )
    n: int = setting(4, "trajectories sampled per prompt (the group size of GRPO)", verl=f"{ARF}.rollout.n")
    temperature: float = setting(1.0, "sampling temperature", verl=f"{ARF}.rollout.temperature")
    top_p: float = setting(
        1.0, "nucleus sampling: smallest token set with this mass", verl=f"{ARF}.rollout.top_p"
    )
    top_k: int = setting(-1, "keep the k likeliest tokens; -1: all", verl=f"{ARF}.rollout.top_k")
    max_response_tokens: int = setting(
        512, "most tokens generated per trajectory (T)", verl="data.max_response_length"
    )
    trajectories_per_generate_batch: int = setting(
        64,
        "trajectories decoded together by the rollout engine (bounds KV-cache memory); 0: no bound "
        "(torch decodes all at once, vLLM keeps its default of 256)",
    )
    ignore_eos: bool = setting(
        False,
        "EOS does not end a training trajectory (it is kept as an ordinary token): responses run to "
        "max_response_tokens unless a stop id ends them",
        verl=f"{ARF}.rollout.ignore_eos",
    )
    min_response_tokens: int = setting(
        0,
        "no training trajectory ends before this many tokens: EOS and stop ids are not sampled until "
        "then (= max_response_tokens: every response has exactly that length)",
    )
    dtype: str | None = setting(
        None,
        "dtype of the weights the rollout engine serves (its own copy; bfloat16: bf16 rollout over "
        "fp32 training, as verl does on GPU); null: model.dtype",
        verl=f"{ARF}.rollout.dtype",
        choices=("float32", "bfloat16", "float16"),
    )
    free_cache_engine: bool = setting(
        True,
        "colocated hand-off: free the rollout engine's KV cache (decode buffers, cached prefixes) when "
        "the same GPU starts a training phase; the next generation allocates it again. A no-op on CPU "
        "(one RAM serves both phases) and for vllm (its pool is preallocated by gpu_memory_utilization; "
        "its prefix cache is reset)",
        verl=f"{ARF}.rollout.free_cache_engine",
    )
    decode_step: str = setting(
        "auto",
        "what computes a decode step of the torch engine: fused (our own step for Llama, Mistral, Qwen2 "
        "and Qwen3: fused QKV and gate/up projections, one-token attention over the KV cache, no mask "
        "building; refused for other families), hf (the model's own forward, every family), auto (fused "
        "where the family is covered, else hf). Prefill always runs the model's forward",
        choices=("auto", "fused", "hf"),
    )
    weight_sharing: str = setting(
        "auto",
        "what the torch engine in the trainer's process serves: share (the actor's own model, no "
        "second copy in memory; a weight sync is a version bump), copy (its own copy, loaded and "
        "checked at every sync), auto (share where that is safe: cluster.backend=in-process, "
        "rollout.backend=torch, trainer.mode=sync, no LoRA, rollout.dtype null or model.dtype; "
        "else copy)",
        choices=("auto", "share", "copy"),
    )
    max_replica_restarts: int = setting(
        0,
        "times over the run a rollout replica of the split placement that died or did not answer "
        "within cluster.call_timeout_s is started again (same replica id and bundle, given the weight "
        "version the others serve) and its unfinished requests re-issued with the same seeds; 0: the "
        "loss stops the run. Needs cluster.backend=ray, cluster.placement=split, trainer.mode=sync; "
        "docs/reliability.md",
    )
    val_kwargs: ValidationSamplingConfig = section(ValidationSamplingConfig, "sampling for validation")


PARAM_DTYPE_DOC = (
    "compute dtype of forward and backward (mixed precision: weights, gradients and the optimizer "
    "stay in model.dtype); null: model.dtype"
)
OFFLOAD_DOC = (
    "keep the sharded parameters, gradients and optimizer step in CPU memory (FSDP2 CPU offload; "
    "GPU training workers only)"
)
RESHARD_DOC = (
    "free each block's gathered parameters after its forward (ZeRO-3); false keeps them for the "
    "backward (ZeRO-2: faster, more memory)"
)
MIXED_DTYPES = ("bfloat16", "float16")


@dataclass
class ActorFSDPConfig:
    """How the policy's model (actor and reference) is sharded over its training workers, and its
    compute precision (stratarl.engine.data_parallel)."""

    param_dtype: str | None = setting(
        None,
        PARAM_DTYPE_DOC,
        verl=f"{ARF}.actor.fsdp_config.mixed_precision.param_dtype",
        choices=MIXED_DTYPES,
    )
    offload_params: bool = setting(False, OFFLOAD_DOC, verl=f"{ARF}.actor.fsdp_config.param_offload")
    optimizer_offload: bool = setting(
        False,
        "colocated hand-off: keep the actor's optimizer state (AdamW moments, 8 bytes a parameter) in "
        "CPU memory between updates, so generation has that GPU memory; moved back for each update. "
        "A no-op on CPU",
        verl=f"{ARF}.actor.fsdp_config.optimizer_offload",
    )
    reshard_after_forward: bool = setting(
        True, RESHARD_DOC, verl=f"{ARF}.actor.fsdp_config.reshard_after_forward"
    )


@dataclass
class CriticFSDPConfig:
    """How the critic's value model is sharded over its workers, and its compute precision."""

    param_dtype: str | None = setting(
        None,
        PARAM_DTYPE_DOC,
        verl="critic.model.fsdp_config.mixed_precision.param_dtype",
        choices=MIXED_DTYPES,
    )
    offload_params: bool = setting(False, OFFLOAD_DOC, verl="critic.model.fsdp_config.param_offload")
    reshard_after_forward: bool = setting(
        True, RESHARD_DOC, verl="critic.model.fsdp_config.reshard_after_forward"
    )


@dataclass
class PolicyLossConfig:
    """The policy loss (a name in stratarl.algo.policy_loss.POLICY_LOSSES) and its parameters."""

    name: str = setting(
        "vanilla", "policy loss (PPO clip is `vanilla`)", verl=f"{ARF}.actor.policy_loss.loss_mode"
    )
    clip_ratio_low: float = setting(
        0.2, "ratio clip below: 1 − clip_ratio_low", verl=f"{ARF}.actor.clip_ratio_low"
    )
    clip_ratio_high: float = setting(
        0.2,
        "ratio clip above: 1 + clip_ratio_high (> low is DAPO's clip-higher)",
        verl=f"{ARF}.actor.clip_ratio_high",
    )
    clip_ratio_c: float = setting(
        3.0, "dual-clip bound for negative advantages (must be > 1)", verl=f"{ARF}.actor.clip_ratio_c"
    )
    tau_pos: float = setting(
        1.0, "SAPO gate temperature for positive advantages", verl=f"{ARF}.actor.tau_pos"
    )
    tau_neg: float = setting(
        1.05, "SAPO gate temperature for negative advantages", verl=f"{ARF}.actor.tau_neg"
    )
    clip_cov_ratio: float = setting(
        2e-4,
        "clip_cov: share of tokens whose gradient is cut",
        verl=f"{ARF}.actor.policy_loss.clip_cov_ratio",
    )
    clip_cov_lb: float = setting(
        1.0, "clip_cov: covariance lower bound", verl=f"{ARF}.actor.policy_loss.clip_cov_lb"
    )
    clip_cov_ub: float = setting(
        5.0, "clip_cov: covariance upper bound", verl=f"{ARF}.actor.policy_loss.clip_cov_ub"
    )
    kl_cov_ratio: float = setting(
        2e-4, "kl_cov: share of tokens given the KL term", verl=f"{ARF}.actor.policy_loss.kl_cov_ratio"
    )
    ppo_kl_coef: float = setting(
        0.1, "kl_cov: weight of the KL term", verl=f"{ARF}.actor.policy_loss.ppo_kl_coef"
    )
    dro_beta: float | None = setting(
        None,
        "dro: weight of the squared log-ratio (must be > 0 for dro)",
        verl=f"{ARF}.actor.policy_loss.dro_beta",
    )


@dataclass
class LoraSettingsConfig:
    """LoRA adapters on the policy (peft; stratarl.engine.lora): only the adapters train, the reference
    is the base model with the adapter disabled, weight syncs after the first move only the adapter."""

    rank: int = setting(
        0, "adapter rank r; 0: no LoRA, the whole model trains", verl=f"{ARF}.model.lora_rank"
    )
    alpha: float = setting(
        16.0, "scale numerator: W' = W + (alpha / rank)·B·A", verl=f"{ARF}.model.lora_alpha"
    )
    target_modules: Any = setting(
        "all-linear",
        "modules given adapters: all-linear, or a list of module names such as [q_proj, v_proj]",
        verl=f"{ARF}.model.target_modules",
    )


@dataclass
class ActorConfig:
    """The policy being trained: optimizer, batch split of a step, and the loss."""

    lr: float = setting(1e-6, "peak learning rate of AdamW", verl=f"{ARF}.actor.optim.lr")
    weight_decay: float = setting(0.01, "AdamW weight decay", verl=f"{ARF}.actor.optim.weight_decay")
    betas: list[float] = setting([0.9, 0.999], "AdamW betas", verl=f"{ARF}.actor.optim.betas")
    adamw_impl: str = setting("auto", ADAMW_IMPL_DOC, choices=ADAMW_IMPLS)
    warmup_steps: int = setting(
        0, "optimizer steps of linear LR warm-up from 0", verl=f"{ARF}.actor.optim.lr_warmup_steps"
    )
    lr_schedule: str = setting(
        "constant", "LR after warm-up", verl=f"{ARF}.actor.optim.lr_scheduler_type", choices=LR_SCHEDULES
    )
    min_lr_ratio: float = setting(
        0.0, "cosine schedule ends at lr · min_lr_ratio", verl=f"{ARF}.actor.optim.min_lr_ratio"
    )
    grad_clip: float = setting(
        1.0, "max global grad norm; a non-finite norm skips the step", verl=f"{ARF}.actor.grad_clip"
    )
    prompts_per_mini_batch: int = setting(
        16,
        "prompts per optimizer step (their trajectories: × rollout.n)",
        verl=f"{ARF}.actor.ppo_mini_batch_size",
    )
    trajectories_per_micro_batch: int = setting(
        16,
        "trajectories per forward/backward pass (gradient accumulation splits a mini-batch into these)",
        verl=f"{ARF}.actor.ppo_micro_batch_size_per_gpu",
    )
    ppo_epochs: int = setting(1, "passes over the step's trajectories", verl=f"{ARF}.actor.ppo_epochs")
    shuffle: bool = setting(
        False, "shuffle trajectories before splitting into mini-batches", verl=f"{ARF}.actor.shuffle"
    )
    old_log_prob_from_update: bool = setting(
        True,
        "when one optimizer step uses the whole batch once (one mini-batch, one epoch) and nothing "
        "before the update reads π_old, take π_old from the update's own forward (detached) instead of "
        "a separate forward: the same numbers, one forward fewer; false: always the separate forward",
    )
    policy_loss: PolicyLossConfig = section(PolicyLossConfig, "the policy loss and its parameters")
    loss_agg_mode: str = setting(
        "token-mean", "how per-token losses become one number", verl=f"{ARF}.actor.loss_agg_mode"
    )
    loss_scale_factor: float | None = setting(
        None,
        "divisor of seq-mean-token-sum-norm; null: the padded response length T",
        verl=f"{ARF}.actor.loss_scale_factor",
    )
    entropy_coeff: float = setting(0.0, "weight of the entropy bonus", verl=f"{ARF}.actor.entropy_coeff")
    use_kl_loss: bool = setting(
        False, "add a KL-to-reference term to the loss (GRPO style)", verl=f"{ARF}.actor.use_kl_loss"
    )
    kl_loss_coef: float = setting(0.001, "weight of the KL loss", verl=f"{ARF}.actor.kl_loss_coef")
    kl_loss_type: str = setting("low_var_kl", "KL estimator of the KL loss", verl=f"{ARF}.actor.kl_loss_type")
    max_tokens_per_micro_batch: int | None = setting(
        None,
        f"{TOKEN_BUDGET_DOC} (trajectories_per_micro_batch)",
        verl=f"{ARF}.actor.ppo_max_token_len_per_gpu (with use_dynamic_bsz)",
    )
    layout: str = setting(
        "packed", LAYOUT_DOC, verl=f"{ARF}.model.use_remove_padding (true: packed)", choices=LAYOUTS
    )
    logit_chunk_size: int | None = setting(
        LOGIT_CHUNK_SIZE, "rows of logits made at a time for log-probs and entropy; null: all at once"
    )
    lora: LoraSettingsConfig = section(LoraSettingsConfig, "LoRA adapters (rank 0: off)")
    fsdp: ActorFSDPConfig = section(ActorFSDPConfig, "sharding and mixed precision of actor and reference")


@dataclass
class ReferenceConfig:
    """The frozen reference policy; it exists only when a KL term needs it. Under LoRA, without a
    model_path of its own, it is the actor's own model with the adapter disabled (no copy), scored
    with the actor's micro-batch settings."""

    model_path: str = setting(
        "",
        "directory of the reference model (same vocabulary as the actor's); empty: a frozen copy of "
        "model.path, the actor's start",
    )
    trajectories_per_micro_batch: int = setting(
        16,
        "trajectories per forward pass when computing ref_log_prob",
        verl=f"{ARF}.ref.log_prob_micro_batch_size_per_gpu",
    )
    max_tokens_per_micro_batch: int | None = setting(
        None,
        f"{TOKEN_BUDGET_DOC} (trajectories_per_micro_batch)",
        verl=f"{ARF}.ref.log_prob_max_token_len_per_gpu (with log_prob_use_dynamic_bsz)",
    )
    layout: str = setting("packed", LAYOUT_DOC, choices=LAYOUTS)
    logit_chunk_size: int | None = setting(
        LOGIT_CHUNK_SIZE,
        "rows of logits made at a time for log-probs; null: all at once (under LoRA the reference "
        "scores through the actor's module: actor.logit_chunk_size applies)",
    )


@dataclass
class CriticConfig:
    """The value model for GAE (PPO). Present for later issues; the GRPO path does not use it."""

    enable: bool | None = setting(
        None,
        "train a critic; null: exactly when the advantage estimator needs values (gae)",
        verl="critic.enable",
    )
    model_path: str = setting(
        "", "directory the critic starts from; empty: model.path", verl="critic.model.path"
    )
    lr: float = setting(1e-5, "peak learning rate of the critic's AdamW", verl="critic.optim.lr")
    weight_decay: float = setting(0.01, "AdamW weight decay", verl="critic.optim.weight_decay")
    adamw_impl: str = setting("auto", ADAMW_IMPL_DOC, choices=ADAMW_IMPLS)
    warmup_steps: int = setting(
        0, "optimizer steps of linear LR warm-up", verl="critic.optim.lr_warmup_steps"
    )
    grad_clip: float = setting(1.0, "max global grad norm", verl="critic.grad_clip")
    prompts_per_mini_batch: int = setting(
        16, "prompts per critic optimizer step", verl="critic.ppo_mini_batch_size"
    )
    trajectories_per_micro_batch: int = setting(
        16, "trajectories per critic forward/backward pass", verl="critic.ppo_micro_batch_size_per_gpu"
    )
    max_tokens_per_micro_batch: int | None = setting(
        None,
        f"{TOKEN_BUDGET_DOC} (trajectories_per_micro_batch)",
        verl="critic.ppo_max_token_len_per_gpu (with use_dynamic_bsz)",
    )
    layout: str = setting(
        "packed", LAYOUT_DOC, verl="critic.model.use_remove_padding (true: packed)", choices=LAYOUTS
    )
    gradient_checkpointing: bool = setting(
        False,
        "recompute activations in the backward pass to save memory",
        verl="critic.model.enable_gradient_checkpointing",
    )
    ppo_epochs: int = setting(1, "critic passes over the step's trajectories", verl="critic.ppo_epochs")
    cliprange_value: float = setting(
        0.5, "value clip range around the old values", verl="critic.cliprange_value"
    )
    loss_agg_mode: str = setting("token-mean", "aggregation of the value loss", verl="critic.loss_agg_mode")
    warmup_training_steps: int = setting(
        0, "training steps that update only the critic before the actor starts", verl="trainer.critic_warmup"
    )
    fsdp: CriticFSDPConfig = section(CriticFSDPConfig, "sharding and mixed precision of the value model")
