"""Layer 5, rewards: turn one outcome per trajectory into token-level scores.

The scalar reward of a response sits on its last action token (the last position where
`response_mask` is 1); every other position is 0. This is verl's `token_level_scores` layout.
"""

from __future__ import annotations

import torch
from torch import Tensor


def place_on_last_token(scores: Tensor, response_mask: Tensor) -> Tensor:
    """token_level_scores [N, T] with scores[i] at the last action token of row i, 0 elsewhere.

    Action tokens need not be contiguous (multi-turn responses interleave observations with
    response_mask 0), so "last" is the last 1 of the mask, not the response length. A row with no
    action token at all gets no score: its row is all zeros.
    """
    if scores.dim() != 1 or response_mask.dim() != 2 or response_mask.shape[0] != scores.shape[0]:
        raise ValueError(
            f"place_on_last_token needs scores [N] and response_mask [N, T], got "
            f"{tuple(scores.shape)} and {tuple(response_mask.shape)}"
        )
    mask = response_mask.bool()  # [N, T]
    dtype = scores.dtype if scores.dtype.is_floating_point else torch.float32
    out = torch.zeros(mask.shape, dtype=dtype, device=scores.device)  # [N, T]
    if mask.shape[1] == 0:
        return out
    # Position of the last True: T-1 minus the first True of the reversed row.
    last = mask.shape[1] - 1 - mask.flip(-1).to(torch.int64).argmax(dim=-1)  # [N]
    has_action = mask.any(dim=-1)  # [N]
    values = torch.where(has_action, scores.to(dtype), torch.zeros((), dtype=dtype, device=scores.device))
    return out.scatter_(1, last.unsqueeze(1), values.unsqueeze(1))
