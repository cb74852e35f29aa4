"""Layer 5, training engine: the forward passes that score response tokens.

`PolicyScorer` wraps a causal LM: log π(y_t | x, y_<t) and the entropy of π at each response token,
under the sampling temperature τ (logits ÷ τ over the full vocabulary, no top-k/top-p: the same
definition the rollout engine uses), with the model's own logit transform (`logit_transform`).
`ValueScorer` wraps a token-classification model with one label: V(s_t) at the same positions.
Both are `nn.Module`s whose forward runs the model body on `ModelInputs` (packed or padded) and the
head only on the K scored positions, so a data-parallel wrapper (FSDP2's `fully_shard`) can take
the scorer as its root module.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from stratarl.engine.fused_head import (
    LOGIT_CHUNK_SIZE,
    LogitTransform,
    head_scores,
    head_scores_naive,
    head_sum_pi_squared,
)
from stratarl.engine.packing import ModelInputs
from stratarl.engine.varlen_attention import use_varlen_attention


@dataclass
class ResponseScores:
    log_prob: Tensor  # [m, T], 0 where no response token
    entropy: Tensor | None  # [m, T], when asked for
    sum_pi_squared: Tensor | None = None  # [m, T] Σ_v π(v)², when asked for (OTB estimators)


@dataclass
class ValueScores:
    values: Tensor  # [m, T] V(s_t), read at the position before response token t; 0 where none


def _hidden_states(body: nn.Module, inputs: ModelInputs, autocast_dtype: torch.dtype | None) -> Tensor:
    """[K, d] last hidden states at the scored positions."""
    device = inputs.input_ids.device
    autocast = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype else nullcontext()
    with autocast:
        out = body(
            input_ids=inputs.input_ids,
            attention_mask=inputs.attention_mask,
            position_ids=inputs.position_ids,
            use_cache=False,
            **inputs.attention_kwargs,
        )
    hidden = out.last_hidden_state  # [b, L, d]
    return hidden.reshape(-1, hidden.shape[-1])[inputs.score_index]


def logit_transform(config) -> LogitTransform:
    """What the model's forward does to its head's output, from the config fields that HF causal LMs
    read there: `final_logit_softcapping` (Gemma 2/3: c·tanh(l/c)), `logit_scale` (Cohere: ×s) and
    `logits_scaling` (Granite: ÷s)."""
    scale = float(getattr(config, "logit_scale", None) or 1.0)
    scale /= float(getattr(config, "logits_scaling", None) or 1.0)
    return LogitTransform(scale=scale, softcap=getattr(config, "final_logit_softcapping", None))


class PolicyScorer(nn.Module):
    """A causal LM (HF `...ForCausalLM`, or its peft-wrapped base) as a response scorer.

    logit_chunk_size: rows of logits made at a time by the head (`fused_head.head_scores`);
    None makes all K·V logits at once (the plain form).
    """

    def __init__(
        self, lm: nn.Module, *, logit_chunk_size: int | None = LOGIT_CHUNK_SIZE, autocast_dtype=None
    ):
        super().__init__()
        use_varlen_attention(lm)
        self.lm = lm
        self.logit_chunk_size = logit_chunk_size
        self.autocast_dtype = autocast_dtype
        self.transform = logit_transform(lm.config)

    def forward(
        self,
        inputs: ModelInputs,
        *,
        temperature: float,
        with_entropy: bool,
        with_sum_pi_squared: bool = False,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:  # [K] log π, [K] H, [K] Σπ²
        hidden = _hidden_states(self.lm.get_decoder(), inputs, self.autocast_dtype)
        head = self.lm.get_output_embeddings()
        kwargs = dict(temperature=temperature, with_entropy=with_entropy, transform=self.transform)
        if self.logit_chunk_size is None:
            log_prob, entropy = head_scores_naive(hidden, head.weight, head.bias, inputs.labels, **kwargs)
        else:
            log_prob, entropy = head_scores(
                hidden, head.weight, head.bias, inputs.labels, chunk_size=self.logit_chunk_size, **kwargs
            )
        sum_pi_squared = (
            head_sum_pi_squared(
                hidden,
                head.weight,
                head.bias,
                temperature=temperature,
                chunk_size=self.logit_chunk_size,
                transform=self.transform,
            )
            if with_sum_pi_squared
            else None
        )
        return log_prob, entropy, sum_pi_squared

    def score(
        self,
        inputs: ModelInputs,
        *,
        temperature: float,
        with_entropy: bool,
        with_sum_pi_squared: bool = False,
    ) -> ResponseScores:
        log_prob, entropy, sum_pi_squared = self(
            inputs,
            temperature=temperature,
            with_entropy=with_entropy,
            with_sum_pi_squared=with_sum_pi_squared,
        )
        return ResponseScores(
            log_prob=inputs.to_grid(log_prob),
            entropy=inputs.to_grid(entropy) if with_entropy else None,
            sum_pi_squared=inputs.to_grid(sum_pi_squared) if with_sum_pi_squared else None,
        )


class ValueScorer(nn.Module):
    """A token-classification model with one label (`AutoModelForTokenClassification`, num_labels=1:
    `base_model` is the body, `score` the scalar head) as a value function.

    V(s_t) for response token t is the head's output at position t−1, the last token of the state
    s_t = (x, y_<t) in which y_t is chosen (verl's critic slices `[:, -T-1:-1]`)."""

    def __init__(self, value_model: nn.Module, *, autocast_dtype=None):
        super().__init__()
        use_varlen_attention(value_model)
        self.value_model = value_model
        self.autocast_dtype = autocast_dtype

    def forward(self, inputs: ModelInputs) -> Tensor:  # [K]
        hidden = _hidden_states(self.value_model.base_model, inputs, self.autocast_dtype)
        dropout = getattr(self.value_model, "dropout", nn.Identity())
        head = self.value_model.score
        # A new tensor, not a view of the head's output: FSDP2 hooks backward onto the module's output,
        # and an in-place op on a returned view would silently skip that hook.
        return head(dropout(hidden.to(head.weight.dtype))).squeeze(-1).float().clone()

    def score(self, inputs: ModelInputs) -> ValueScores:
        return ValueScores(values=inputs.to_grid(self(inputs)))
