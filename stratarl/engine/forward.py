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
from stratarl.engine.top_k_head import head_log_probs_at, head_top_k
from stratarl.engine.varlen_attention import use_varlen_attention


@dataclass
class ResponseScores:
    log_prob: Tensor  # [m, T], 0 where no response token
    entropy: Tensor | None  # [m, T], when asked for
    sum_pi_squared: Tensor | None = None  # [m, T] Σ_v π(v)², when asked for (OTB estimators)
    # With `ModelInputs.score_at_ids` (the student in forward_kl_topk): [m, T, k] log π at those ids
    # (with gradient) and [m, T, k] this model's own k most likely ids (no gradient). With a top-k
    # request (the teacher): [m, T, k] its k most likely ids and their log π.
    top_k_log_probs: Tensor | None = None
    top_k_ids: Tensor | None = None


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
        top_k: int = 0,
    ) -> dict[str, Tensor]:
        """{name: [K] or [K, k]}: `log_prob`, and `entropy`, `sum_pi_squared`, `top_k_log_probs` /
        `top_k_ids` (at `inputs.score_at_ids`, or this model's own top_k) when asked for. A dict, so a
        data-parallel wrapper finds every output tensor."""
        hidden = _hidden_states(self.lm.get_decoder(), inputs, self.autocast_dtype)
        head = self.lm.get_output_embeddings()
        w, b = head.weight, head.bias
        kwargs = dict(temperature=temperature, with_entropy=with_entropy, transform=self.transform)
        if self.logit_chunk_size is None:
            log_prob, entropy = head_scores_naive(hidden, w, b, inputs.labels, **kwargs)
        else:
            log_prob, entropy = head_scores(
                hidden, w, b, inputs.labels, chunk_size=self.logit_chunk_size, **kwargs
            )
        out = {"log_prob": log_prob, "entropy": entropy}
        chunked = dict(temperature=temperature, chunk_size=self.logit_chunk_size, transform=self.transform)
        if with_sum_pi_squared:
            out["sum_pi_squared"] = head_sum_pi_squared(hidden, w, b, **chunked)
        if inputs.score_at_ids is not None:
            out["top_k_log_probs"], out["top_k_ids"] = head_log_probs_at(
                hidden, w, b, inputs.score_at_ids, **chunked
            )
        elif top_k:
            out["top_k_ids"], out["top_k_log_probs"] = head_top_k(hidden, w, b, top_k, **chunked)
        return {name: value for name, value in out.items() if value is not None}

    def score(
        self,
        inputs: ModelInputs,
        *,
        temperature: float,
        with_entropy: bool,
        with_sum_pi_squared: bool = False,
        top_k: int = 0,
    ) -> ResponseScores:
        out = self(
            inputs,
            temperature=temperature,
            with_entropy=with_entropy,
            with_sum_pi_squared=with_sum_pi_squared,
            top_k=top_k,
        )

        def grid(name: str, dtype: torch.dtype = torch.float32) -> Tensor | None:
            return inputs.to_grid(out[name], dtype) if name in out else None

        return ResponseScores(
            log_prob=grid("log_prob"),
            entropy=grid("entropy"),
            sum_pi_squared=grid("sum_pi_squared"),
            top_k_log_probs=grid("top_k_log_probs"),
            top_k_ids=grid("top_k_ids", torch.long),
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
