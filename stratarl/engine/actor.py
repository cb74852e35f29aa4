"""Layer 5, training engine: the `Actor` (the policy being trained) and the frozen `Reference`.

The actor scores responses (log π and entropy per response token, `forward.PolicyScorer`) and
applies updates from a loss_fn (`training.TrainingEngine`: micro-batches by rows or by token budget,
packed sequences, globally normalised accumulation, FSDP2 over ranks). Its weights leave it as a
full HF state dict (weight sync, export), with LoRA adapters merged; after a first full sync a LoRA
actor can send only its adapters (`export_adapter`).
"""

from __future__ import annotations

import copy
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from stratarl.engine.data_parallel import DataParallel
from stratarl.engine.forward import PolicyScorer, ResponseScores
from stratarl.engine.fused_head import LOGIT_CHUNK_SIZE
from stratarl.engine.lora import (
    AdapterUpdate,
    adapter_update,
    is_lora,
    lora_scalings,
    merge_lora_state,
    strip_prefix,
)
from stratarl.engine.micro_batches import MicroBatching, run_in_micro_batches
from stratarl.engine.perf import ModelFlops
from stratarl.engine.requests import LOG_PROBS_ONLY, ScoreRequest
from stratarl.engine.training import (
    BatchTotals,
    LossFn,
    OptimizerSettings,
    TrainingEngine,
    block_class_names,
    enable_activation_checkpointing,
)
from stratarl.observe.run_log import naming_the_file
from stratarl.transport.data_proto import DataProto

__all__ = [
    "Actor",
    "BatchTotals",
    "LossFn",
    "OptimizerSettings",
    "Reference",
    "ResponseScores",
    "compute_log_probs",
]


def causal_lm_of(model: nn.Module) -> nn.Module:
    """The HF causal LM inside `model` (peft's injected base model for a LoRA policy)."""
    return model.get_base_model() if is_lora(model) else model


def _batching(lm: nn.Module, micro_batch_size: int, max_tokens: int | None, layout: str) -> MicroBatching:
    # workload a·s + s² with a = 12·d: linear layers ≈ 24·d² FLOPs/token, attention ≈ 2·d per token pair
    linear_coeff = 12.0 * lm.config.hidden_size
    return MicroBatching(micro_batch_size, max_tokens=max_tokens, layout=layout, linear_coeff=linear_coeff)


def _score_batch(
    module: nn.Module,
    batch: DataProto,
    batching: MicroBatching,
    dp: DataParallel,
    *,
    temperature: float,
    request: ScoreRequest = LOG_PROBS_ONLY,
    context: AbstractContextManager | None = None,
) -> dict[str, Tensor]:
    """[N, T] columns without gradients, 0 outside response_mask: `log_prob`, and `entropy` /
    `sum_pi_squared` when the request asks for them; with `request.top_k`, [N, T, k] `top_k_ids`
    (int64) and `top_k_log_probs`."""

    def score(inputs):
        scores = module.score(
            inputs,
            temperature=temperature,
            with_entropy=request.with_entropy,
            with_sum_pi_squared=request.with_sum_pi_squared,
            top_k=request.top_k,
        )
        columns = {"log_prob": scores.log_prob, "entropy": scores.entropy}
        columns["sum_pi_squared"] = scores.sum_pi_squared
        columns |= {"top_k_ids": scores.top_k_ids, "top_k_log_probs": scores.top_k_log_probs}
        return {name: value for name, value in columns.items() if value is not None}

    was_training = module.training
    module.eval()
    with context or nullcontext():
        out = run_in_micro_batches(batch, batching, dp, score, dp.compute_device(module))
    module.train(was_training)
    mask = batch["response_mask"].bool()
    return {name: _masked(value, mask) for name, value in out.items()}


def _masked(value: Tensor, mask: Tensor) -> Tensor:  # [N, T, ...], [N, T] -> 0 outside the mask
    mask = mask.reshape(*mask.shape, *[1] * (value.dim() - mask.dim()))
    return torch.where(mask, value, torch.zeros((), dtype=value.dtype))


def compute_log_probs(
    model: nn.Module,
    batch: DataProto,
    *,
    micro_batch_size: int,
    temperature: float,
    with_entropy: bool = False,
    max_tokens_per_micro_batch: int | None = None,
    layout: str = "packed",
    logit_chunk_size: int | None = LOGIT_CHUNK_SIZE,
) -> tuple[Tensor, Tensor | None]:
    """[N, T] log-probs (and entropies) of the responses under `model`, in one process, no gradients."""
    lm = causal_lm_of(model)
    scorer = PolicyScorer(lm, logit_chunk_size=logit_chunk_size)
    batching = _batching(lm, micro_batch_size, max_tokens_per_micro_batch, layout)
    request = ScoreRequest(with_entropy=with_entropy)
    out = _score_batch(scorer, batch, batching, DataParallel(), temperature=temperature, request=request)
    return out["log_prob"], out.get("entropy")


class Actor(TrainingEngine):
    """The trained policy: scores responses and applies updates from a loss_fn.

    optim: AdamW, its LR schedule and the gradient clip (`OptimizerSettings`; adamw_impl: the kernel,
    `optim.ADAMW_IMPLS`, default auto: torch chooses, the per-parameter loop on CPU).
    max_tokens_per_micro_batch: micro-batches by token budget instead of `micro_batch_size` rows.
    layout: "packed" (no compute on padding) or "padded". logit_chunk_size: rows of logits at a time
    (None: all at once). data_parallel: FSDP2 over a mesh, mixed precision, offload (one process by
    default). gradient_checkpointing: recompute block activations in the backward. peak_flops: the
    MFU denominator (default `perf.default_peak_flops`).
    """

    role = "actor"

    def __init__(
        self,
        model: nn.Module,
        *,
        optim: OptimizerSettings,
        micro_batch_size: int,
        temperature: float = 1.0,
        max_tokens_per_micro_batch: int | None = None,
        layout: str = "packed",
        logit_chunk_size: int | None = LOGIT_CHUNK_SIZE,
        data_parallel: DataParallel | None = None,
        gradient_checkpointing: bool = False,
        peak_flops: float | None = None,
    ):
        self.model = model
        self.temperature = temperature
        lm = causal_lm_of(model)
        if gradient_checkpointing:
            enable_activation_checkpointing(lm)
        dp = data_parallel or DataParallel()
        scorer = PolicyScorer(lm, logit_chunk_size=logit_chunk_size, autocast_dtype=dp.autocast_dtype)
        super().__init__(
            dp.shard(scorer, block_class_names(lm)),
            optim=optim,
            batching=_batching(lm, micro_batch_size, max_tokens_per_micro_batch, layout),
            dp=dp,
            flops=ModelFlops.from_model(lm, lm.get_output_embeddings()),
            peak_flops=peak_flops,
        )

    @property
    def micro_batch_size(self) -> int:
        return self.batching.micro_batch_size

    @property
    def lm(self) -> nn.Module:
        return self.module.lm

    def _forward(self, inputs, *, with_entropy: bool) -> ResponseScores:
        return self.module.score(inputs, temperature=self.temperature, with_entropy=with_entropy)

    def _zero_weight_pass(self, scores: ResponseScores) -> Tensor:
        return scores.log_prob.sum() * 0.0

    def compute_log_prob(
        self, batch: DataProto, *, with_entropy: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """[N, T] log π_θ (old_log_probs) and entropies, no gradients, 0 outside response_mask."""
        out = self.score_responses(batch, ScoreRequest(with_entropy=with_entropy))
        return out["log_prob"], out.get("entropy")

    def score_responses(self, batch: DataProto, request: ScoreRequest = LOG_PROBS_ONLY) -> dict[str, Tensor]:
        """One no-grad forward: [N, T] `log_prob`, plus `entropy` and `sum_pi_squared` (Σ_v π(v)²,
        for the optimal-token-baseline estimators) when the request asks; 0 outside response_mask."""
        return _score_batch(
            self.module, batch, self.batching, self.dp, temperature=self.temperature, request=request
        )

    # --- weights out -----------------------------------------------------------------------------
    def export_weights(self) -> dict[str, Tensor]:
        """The full HF state dict (LoRA merged), for the rollout engine's `load_weights` and for
        saving. A collective when sharded: every rank calls it, rank 0 receives the tensors."""
        state = strip_prefix(self.dp.full_model_state(self.module), "lm.")
        if is_lora(self.model) and state:
            return merge_lora_state(state, lora_scalings(self.lm))
        return state

    def export_adapter(self) -> AdapterUpdate:
        """Only the LoRA A, B and scales: a weight sync after the first full one (`lora` module)."""
        if not is_lora(self.model):
            raise ValueError("export_adapter needs a LoRA actor (see engine.lora.apply_lora)")
        state = strip_prefix(self.dp.full_model_state(self.module), "lm.")
        return adapter_update(state, lora_scalings(self.lm)) if state else AdapterUpdate({}, {}, {})

    def save_hf(self, out_dir: str | Path, *, tokenizer: Any = None) -> Path:
        """The policy as an HF directory (`from_pretrained` loads it; LoRA merged). Rank 0 writes."""
        state = self.export_weights()
        out_dir = Path(out_dir)
        if self.dp.rank == 0:
            with naming_the_file(out_dir):  # a full disk: its OSError names no file
                self.lm.save_pretrained(out_dir, state_dict=state)
                if tokenizer is not None:
                    tokenizer.save_pretrained(out_dir)
        self.dp.barrier()
        return out_dir


class Reference:
    """log π_ref for KL terms, never trained: a frozen copy of a policy, or — for a LoRA actor — the
    actor's own model with the adapter disabled (`base_of`, no second copy)."""

    def __init__(
        self,
        model: nn.Module,
        *,
        micro_batch_size: int,
        temperature: float = 1.0,
        max_tokens_per_micro_batch: int | None = None,
        layout: str = "packed",
        logit_chunk_size: int | None = LOGIT_CHUNK_SIZE,
        data_parallel: DataParallel | None = None,
    ):
        self.model = model.eval().requires_grad_(False)
        self.temperature = temperature
        self.dp = data_parallel or DataParallel()
        lm = causal_lm_of(model)
        scorer = PolicyScorer(lm, logit_chunk_size=logit_chunk_size, autocast_dtype=self.dp.autocast_dtype)
        self.module = self.dp.shard(scorer, block_class_names(lm))
        self.batching = _batching(lm, micro_batch_size, max_tokens_per_micro_batch, layout)
        self._context = nullcontext

    @classmethod
    def copy_of(cls, model: nn.Module, **kwargs) -> Reference:
        return cls(copy.deepcopy(model), **kwargs)

    @classmethod
    def base_of(
        cls,
        actor: Actor,
        *,
        micro_batch_size: int | None = None,
        max_tokens_per_micro_batch: int | None = None,
        layout: str | None = None,
    ) -> Reference:
        """The base model under a LoRA actor: same weights in memory, adapter disabled while scoring.
        Its own micro-batching (each setting left None is the actor's); the logit chunk size is the
        actor's, since the scoring module is shared."""
        if not is_lora(actor.model):
            raise ValueError("Reference.base_of needs a LoRA actor; use Reference.copy_of otherwise")
        reference = cls.__new__(cls)
        reference.model, reference.module = actor.model, actor.module
        reference.temperature, reference.dp = actor.temperature, actor.dp
        own = actor.batching
        reference.batching = MicroBatching(
            micro_batch_size or own.micro_batch_size,
            max_tokens=max_tokens_per_micro_batch
            if max_tokens_per_micro_batch is not None
            else own.max_tokens,
            layout=layout or own.layout,
            linear_coeff=own.linear_coeff,
        )
        reference._context = actor.model.disable_adapter
        return reference

    @property
    def micro_batch_size(self) -> int:
        return self.batching.micro_batch_size

    def compute_log_prob(self, batch: DataProto) -> Tensor:
        return self.score_responses(batch)["log_prob"]

    def score_responses(self, batch: DataProto, request: ScoreRequest = LOG_PROBS_ONLY) -> dict[str, Tensor]:
        """One no-grad forward: [N, T] `log_prob`, and what the request asks beside it (a teacher's
        [N, T, k] `top_k_ids` and `top_k_log_probs`); 0 outside response_mask."""
        return _score_batch(
            self.module,
            batch,
            self.batching,
            self.dp,
            temperature=self.temperature,
            request=request,
            context=self._context(),
        )
