"""Layer 5, agent loops: finished trajectories laid out as the trainer's batch edge (verl's layout).

Prompts left-padded to P, responses right-padded to T with assistant AND observation tokens in
order, `input_ids = cat(prompts, responses)`, `attention_mask` 1 on every real token (observations
included: the model reads them), `position_ids = cumsum(attention_mask) − 1` clipped at 0,
`response_mask` 1 only on sampled tokens, `rollout_log_probs` 0 wherever `response_mask` is 0.
When the trajectories were scored, `token_level_scores` holds each reward on its last ACTION token
(never on an observation token that follows it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from stratarl.agent.trajectory import Trajectory
from stratarl.reward.token_scores import place_on_last_token


def trajectories_to_batch(
    trajectories: Sequence[Trajectory],
    *,
    pad_token_id: int,
    max_prompt_len: int | None = None,
    max_response_len: int | None = None,
) -> tuple[dict[str, Tensor], list[dict[str, Any]]]:
    """(tensors, records): tensors `prompts` [N, P], `responses` [N, T], `input_ids` /
    `attention_mask` / `position_ids` [N, P+T], `response_mask` [N, T] int64, `rollout_log_probs`
    [N, T] float32, `num_turns` [N] int64, `weight_version` [N] int64 (the newest version that
    sampled a turn), and `token_level_scores` [N, T] when every trajectory has a reward; records: one
    `Trajectory.record()` per row (turns, tool calls, stop reason). A prompt or response longer than
    a given maximum raises ValueError naming the request."""
    if not trajectories:
        raise ValueError("trajectories_to_batch needs at least one trajectory")
    P = _length([t.prompt_ids for t in trajectories], max_prompt_len, "prompt", trajectories)
    T = _length([t.response_ids for t in trajectories], max_response_len, "response", trajectories)
    N = len(trajectories)
    prompts = torch.full((N, P), pad_token_id, dtype=torch.int64)
    prompt_mask = torch.zeros((N, P), dtype=torch.int64)
    responses = torch.full((N, T), pad_token_id, dtype=torch.int64)
    response_attention = torch.zeros((N, T), dtype=torch.int64)
    response_mask = torch.zeros((N, T), dtype=torch.int64)
    log_probs = torch.zeros((N, T), dtype=torch.float32)
    for i, t in enumerate(trajectories):
        p, r = len(t.prompt_ids), len(t.response_ids)
        prompts[i, P - p :] = torch.tensor(t.prompt_ids, dtype=torch.int64)
        prompt_mask[i, P - p :] = 1
        responses[i, :r] = torch.tensor(t.response_ids, dtype=torch.int64)
        response_attention[i, :r] = 1
        response_mask[i, :r] = torch.tensor(t.response_mask, dtype=torch.int64)
        log_probs[i, :r] = torch.tensor(t.response_log_probs, dtype=torch.float32)
    log_probs = log_probs * response_mask  # 0 under mask 0, whatever a trajectory carried
    attention_mask = torch.cat([prompt_mask, response_attention], dim=-1)  # [N, P+T]
    batch = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=-1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(dim=-1) - 1).clamp(min=0),
        "response_mask": response_mask,
        "rollout_log_probs": log_probs,
        "num_turns": torch.tensor([t.num_turns for t in trajectories], dtype=torch.int64),
        "weight_version": torch.tensor([_version(t) for t in trajectories], dtype=torch.int64),
    }
    if all(t.reward is not None for t in trajectories):
        scores = torch.tensor([float(t.reward) for t in trajectories], dtype=torch.float32)  # [N]
        batch["token_level_scores"] = place_on_last_token(scores, response_mask)
    return batch, [t.record() for t in trajectories]


def _version(trajectory: Trajectory) -> int:
    versions = [turn.weight_version for turn in trajectory.turns if turn.weight_version is not None]
    return max(versions) if versions else 0


def _length(
    sequences: Sequence[Sequence[int]], limit: int | None, what: str, trajectories: Sequence[Trajectory]
) -> int:
    longest = max(len(s) for s in sequences)
    if limit is None:
        return max(longest, 1)
    too_long = [t.request_id for t, s in zip(trajectories, sequences, strict=True) if len(s) > limit]
    if too_long:
        raise ValueError(f"{what} longer than max_{what}_len={limit} in requests {too_long[:10]}")
    return limit
