"""Layer 4, data transport: the batch edge — token sequences laid out as every phase reads them.

Prompts left-padded to P, responses right-padded to T (verl's layout), `input_ids = cat(prompts,
responses)`, `attention_mask` 1 on real tokens, `position_ids = cumsum(attention_mask) − 1`
clipped at 0, `response_mask` 1 on action tokens. One function, used by the rollout engine's
results, the agent loop's multi-turn trajectories and SFT examples alike.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def padded_length(
    sequences: Sequence[Sequence[int]], limit: int | None, what: str, names: Sequence[str]
) -> int:
    """The padded width: `limit`, or the longest sequence (at least 1). A sequence longer than `limit`
    raises ValueError naming it (`names[i]` names sequence i)."""
    longest = max((len(s) for s in sequences), default=0)
    if limit is None:
        return max(longest, 1)
    too_long = [name for name, s in zip(names, sequences, strict=True) if len(s) > limit]
    if too_long:
        raise ValueError(f"{what} longer than max_{what}_len={limit} in requests {too_long[:10]}")
    return limit


def lay_out_batch_edge(
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    prompt_len: int,  # P
    response_len: int,  # T
    action_mask: Sequence[Sequence[int]] | None = None,  # 1 on sampled tokens; None: every token
    log_probs: Sequence[Sequence[float]] | None = None,  # of the sampled tokens
) -> dict[str, Tensor]:
    """`prompts` [N, P], `responses` [N, T], `input_ids`/`attention_mask`/`position_ids` [N, P+T],
    `response_mask` [N, T] (int64), and `rollout_log_probs` [N, T] (float32, 0 where the mask is 0)
    when `log_probs` are given. Sequences must already fit P and T."""
    N = len(prompt_ids)
    prompts = torch.full((N, prompt_len), pad_token_id, dtype=torch.int64)
    prompt_mask = torch.zeros((N, prompt_len), dtype=torch.int64)
    responses = torch.full((N, response_len), pad_token_id, dtype=torch.int64)
    response_attention = torch.zeros((N, response_len), dtype=torch.int64)
    response_mask = torch.zeros((N, response_len), dtype=torch.int64)
    rollout_log_probs = torch.zeros((N, response_len), dtype=torch.float32)
    for i, (prompt, response) in enumerate(zip(prompt_ids, response_ids, strict=True)):
        p, t = len(prompt), len(response)
        prompts[i, prompt_len - p :] = torch.tensor(prompt, dtype=torch.int64)
        prompt_mask[i, prompt_len - p :] = 1
        responses[i, :t] = torch.tensor(response, dtype=torch.int64)
        response_attention[i, :t] = 1
        response_mask[i, :t] = 1 if action_mask is None else torch.tensor(action_mask[i], dtype=torch.int64)
        if log_probs is not None:
            rollout_log_probs[i, :t] = torch.tensor(log_probs[i], dtype=torch.float32)
    attention_mask = torch.cat([prompt_mask, response_attention], dim=-1)  # [N, P+T]
    batch = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=-1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(dim=-1) - 1).clamp(min=0),
        "response_mask": response_mask,
    }
    if log_probs is not None:
        batch["rollout_log_probs"] = rollout_log_probs * response_mask  # 0 under mask 0
    return batch


NO_VERSION = -1  # `token_weight_version` where no weights sampled the token (observations, padding)


def token_versions(versions: Sequence[Sequence[int]], *, response_len: int) -> Tensor:
    """`token_weight_version` [N, T] int64: the weight version that sampled each response token,
    right-padded with NO_VERSION (as are observation tokens, given as NO_VERSION)."""
    out = torch.full((len(versions), response_len), NO_VERSION, dtype=torch.int64)
    for i, row in enumerate(versions):
        out[i, : len(row)] = torch.tensor(list(row), dtype=torch.int64)
    return out


def version_spans(row: Tensor) -> list[list[int]]:
    """One row of `token_weight_version` [T] as [[first response index, version], ...]: where each
    version's tokens begin (observation and padding tokens, NO_VERSION, belong to no span). One span
    unless the response was continued across a weight push."""
    spans: list[list[int]] = []
    for index, version in enumerate(row.tolist()):
        if version != NO_VERSION and (not spans or spans[-1][1] != version):
            spans.append([index, version])
    return spans
