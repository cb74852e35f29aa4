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
from stratarl.transport.batch_edge import lay_out_batch_edge, padded_length, token_versions


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
    (float32), `weight_version` [N] (int64, the oldest version in the response),
    `token_weight_version` [N, T] (int64, the version of each token, -1 on padding), and lists
    `request_id`, `finish_reason`, `replica_id` [N].
    """
    if not results:
        raise ValueError("results_to_batch needs at least one result")
    names = [r.request_id for r in results]
    prompt_ids, response_ids = [r.prompt_ids for r in results], [r.response_ids for r in results]
    batch: dict[str, Tensor | list] = lay_out_batch_edge(
        prompt_ids,
        response_ids,
        pad_token_id=pad_token_id,
        prompt_len=padded_length(prompt_ids, max_prompt_len, "prompt", names),
        response_len=padded_length(response_ids, max_response_len, "response", names),
        log_probs=[r.log_probs for r in results],
    )
    T = batch["responses"].shape[1]
    return batch | {
        "weight_version": torch.tensor([r.weight_version for r in results], dtype=torch.int64),
        "token_weight_version": token_versions([r.token_versions for r in results], response_len=T),
        "request_id": [r.request_id for r in results],
        "finish_reason": [r.finish_reason for r in results],
        "replica_id": [r.replica_id for r in results],
    }
