"""Layer 5, rollout: generation results laid out as the trainer's batch edge (verl's layout).

Prompts left-padded to P, responses right-padded to T, `input_ids = cat(prompts, responses)`,
`attention_mask` 1 on real tokens, `position_ids = cumsum(attention_mask) - 1` clipped at 0,
`response_mask` 1 on sampled (action) tokens, `rollout_log_probs` 0 on padding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from stratarl.rollout.interface import GenerationResult


def results_to_batch(
    results: Sequence[GenerationResult],
    *,
    pad_token_id: int,
    max_prompt_len: int | None = None,
    max_response_len: int | None = None,
) -> dict[str, Tensor | list]:
    """Stack N results into padded tensors.

    P = max_prompt_len (or the longest prompt), T = max_response_len (or the longest response);
    a prompt or response longer than a given maximum raises ValueError naming the request.
    Returns tensors `prompts` [N, P], `responses` [N, T], `input_ids` / `attention_mask` /
    `position_ids` [N, P+T] (int64), `response_mask` [N, T] (int64), `rollout_log_probs` [N, T]
    (float32), `weight_version` [N] (int64), and lists `request_id`, `finish_reason`, `replica_id` [N].
    """
    if not results:
        raise ValueError("results_to_batch needs at least one result")
    P = _padded_length([r.prompt_ids for r in results], max_prompt_len, "prompt", results)
    T = _padded_length([r.response_ids for r in results], max_response_len, "response", results)
    N = len(results)
    prompts = torch.full((N, P), pad_token_id, dtype=torch.int64)
    prompt_mask = torch.zeros((N, P), dtype=torch.int64)
    responses = torch.full((N, T), pad_token_id, dtype=torch.int64)
    response_mask = torch.zeros((N, T), dtype=torch.int64)
    rollout_log_probs = torch.zeros((N, T), dtype=torch.float32)
    for i, r in enumerate(results):
        p, t = len(r.prompt_ids), len(r.response_ids)
        prompts[i, P - p :] = torch.tensor(r.prompt_ids, dtype=torch.int64)
        prompt_mask[i, P - p :] = 1
        responses[i, :t] = torch.tensor(r.response_ids, dtype=torch.int64)
        response_mask[i, :t] = 1
        rollout_log_probs[i, :t] = torch.tensor(r.log_probs, dtype=torch.float32)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=-1)  # [N, P+T]
    return {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=-1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(dim=-1) - 1).clamp(min=0),
        "response_mask": response_mask,
        "rollout_log_probs": rollout_log_probs,
        "weight_version": torch.tensor([r.weight_version for r in results], dtype=torch.int64),
        "request_id": [r.request_id for r in results],
        "finish_reason": [r.finish_reason for r in results],
        "replica_id": [r.replica_id for r in results],
    }


def _padded_length(
    sequences: Sequence[Sequence[int]], limit: int | None, what: str, results: Sequence[GenerationResult]
) -> int:
    longest = max(len(s) for s in sequences)
    if limit is None:
        return longest
    too_long = [r.request_id for r, s in zip(results, sequences, strict=True) if len(s) > limit]
    if too_long:
        raise ValueError(f"{what} longer than max_{what}_len={limit} in requests {too_long[:10]}")
    return limit
