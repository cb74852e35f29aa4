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
from stratarl.transport.batch_edge import lay_out_batch_edge, padded_length, token_versions


def trajectories_to_batch(
    trajectories: Sequence[Trajectory],
    *,
    pad_token_id: int,
    max_prompt_len: int | None = None,
    max_response_len: int | None = None,
) -> tuple[dict[str, Tensor], list[dict[str, Any]]]:
    """(tensors, records): tensors `prompts` [N, P], `responses` [N, T], `input_ids` /
    `attention_mask` / `position_ids` [N, P+T], `response_mask` [N, T] int64, `rollout_log_probs`
    [N, T] float32, `num_turns` [N] int64, `weight_version` [N] int64 (the oldest version that
    sampled a token of it: what its staleness is measured from), `token_weight_version` [N, T]
    int64 (the version of each sampled token, -1 on observations and padding), and
    `token_level_scores` [N, T] when every trajectory has a reward; records: one `Trajectory.record()`
    per row (turns, tool calls, stop reason). A prompt or response longer than a given maximum
    raises ValueError naming the request."""
    if not trajectories:
        raise ValueError("trajectories_to_batch needs at least one trajectory")
    names = [t.request_id for t in trajectories]
    prompt_ids, response_ids = [t.prompt_ids for t in trajectories], [t.response_ids for t in trajectories]
    batch = lay_out_batch_edge(
        prompt_ids,
        response_ids,
        pad_token_id=pad_token_id,
        prompt_len=padded_length(prompt_ids, max_prompt_len, "prompt", names),
        response_len=padded_length(response_ids, max_response_len, "response", names),
        action_mask=[t.response_mask for t in trajectories],
        log_probs=[t.response_log_probs for t in trajectories],
    )
    response_mask = batch["response_mask"]
    batch |= {
        "num_turns": torch.tensor([t.num_turns for t in trajectories], dtype=torch.int64),
        "weight_version": torch.tensor([_version(t) for t in trajectories], dtype=torch.int64),
        "token_weight_version": token_versions(
            [t.response_versions for t in trajectories], response_len=response_mask.shape[1]
        ),
    }
    if all(t.reward is not None for t in trajectories):
        scores = torch.tensor([float(t.reward) for t in trajectories], dtype=torch.float32)  # [N]
        batch["token_level_scores"] = place_on_last_token(scores, response_mask)
    return batch, [t.record() for t in trajectories]


def _version(trajectory: Trajectory) -> int:
    versions = [turn.weight_version for turn in trajectory.turns if turn.weight_version is not None]
    return min(versions) if versions else 0
