"""Layer 5, rewards: DAPO's soft overlong penalty (Yu et al., arXiv:2503.14476, §3.4).

With response budget L_max and a buffer of L_buf tokens at its end, a response of length |y| gets

    R_len(y) = min( −(|y| − (L_max − L_buf)) / L_buf · factor , 0 )

i.e. 0 up to L_max − L_buf tokens, then a linear ramp down to −factor at L_max. The penalty is
added to the task score. As verl's dapo manager, |y| counts every response token (observation
tokens of a multi-turn response included), not only the action tokens.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from stratarl.reward.batch_scorer import RewardResult


def overlong_penalty(
    response_lengths: Tensor,  # [N] tokens in each response
    *,
    max_response_length: int,
    buffer_length: int,
    penalty_factor: float = 1.0,
) -> Tensor:  # [N] float32, <= 0
    """The per-response penalty R_len above (0 inside the safe zone)."""
    if not 0 < buffer_length <= max_response_length:
        raise ValueError(
            f"overlong buffer_length must be in (0, max_response_length={max_response_length}], "
            f"got {buffer_length}"
        )
    exceed = response_lengths.to(torch.float32) - (max_response_length - buffer_length)  # [N]
    return torch.clamp(-exceed / buffer_length * penalty_factor, max=0.0)


def with_overlong_penalty(
    result: RewardResult,
    response_lengths: Tensor,  # [N]
    *,
    max_response_length: int,
    buffer_length: int,
    penalty_factor: float = 1.0,
) -> RewardResult:
    """`result` with R_len added to every score, and verl's extras `overlong_reward` and `overlong`."""
    penalty = overlong_penalty(
        response_lengths,
        max_response_length=max_response_length,
        buffer_length=buffer_length,
        penalty_factor=penalty_factor,
    )
    extra = dict(result.extra)
    extra["overlong_reward"] = penalty.tolist()
    extra["overlong"] = (penalty < 0).to(torch.float32).tolist()
    return dataclasses.replace(result, scores=result.scores + penalty, extra=extra)
