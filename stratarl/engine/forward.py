"""Layer 5, training engine: the forward pass that scores response tokens.

log π(y_t | x, y_<t) and the entropy of π at every response position, under the sampling
temperature τ: logits are divided by τ before the softmax, over the full vocabulary (no top-k/top-p
renormalisation), the same definition the rollout engine uses for its sampled-token log-probs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from stratarl.algo.entropy import entropy_from_logits, log_prob_from_logits


@dataclass
class ResponseScores:
    log_prob: Tensor  # [m, T]
    entropy: Tensor | None  # [m, T], when asked for


def score_responses(
    model: nn.Module,
    input_ids: Tensor,  # [m, P+T] left-padded prompt then right-padded response
    attention_mask: Tensor,  # [m, P+T]
    position_ids: Tensor,  # [m, P+T]
    response_len: int,  # T
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> ResponseScores:
    """Log-prob (and entropy) of each response token y_t, read from the logits at position t−1."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for scoring, got {temperature}")
    out = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
    )
    # Position i predicts token i+1: responses occupy the last T positions, so their logits are the
    # T positions before them.
    logits = out.logits[:, -response_len - 1 : -1, :].float() / temperature  # [m, T, V]
    responses = input_ids[:, -response_len:]  # [m, T]
    log_prob = log_prob_from_logits(logits, responses)
    entropy = entropy_from_logits(logits) if with_entropy else None
    return ResponseScores(log_prob=log_prob, entropy=entropy)


@torch.no_grad()
def score_responses_no_grad(model: nn.Module, *args, **kwargs) -> ResponseScores:
    """score_responses without building an autograd graph (old/ref log-probs)."""
    return score_responses(model, *args, **kwargs)
