"""Layer 6, RL math: Generalized Advantage Estimation (GAE) from a critic's values, the PPO estimator.

Multi-turn safe: observation tokens (mask 0) between turns are skipped by the recursion, so the
advantage of an action token looks through a tool result to the next action token.
"""

from __future__ import annotations

import torch
from torch import Tensor

from stratarl.algo.advantages.inputs import check_token_fields
from stratarl.algo.masked import masked_whiten


@torch.no_grad()
def gae_advantages(
    token_level_rewards: Tensor,  # [N, T] r_t
    values: Tensor,  # [N, T] V_t from the critic
    response_mask: Tensor,  # [N, T] 1 on action tokens
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[Tensor, Tensor]:  # advantages [N, T], returns [N, T]
    """GAE (Schulman et al. 2016, arXiv:1506.02438), as a reverse scan over the response tokens:

        δ_t = r_t + γ·V_next − V_t,        Â_t = δ_t + γλ·Â_next,

    where V_next and Â_next belong to the next *action* token (mask 1) to the right, and are 0
    past the last one. A position with mask 0 (an observation token or padding) does not update
    V_next and Â_next; it passes them through, and stores the Â_next it passes as its own value.

    returns = Â + V (the critic's regression target, unwhitened).
    advantages = masked_whiten(Â, mask): shifted and scaled by the mean and unbiased variance of Â
    over every action token of the batch. Positions with mask 0 are transformed too and are not
    zeroed (as in verl); the loss masks them. The whitening needs ≥ 2 action tokens in the batch.

    gamma (γ) discounts later rewards; lam (λ) trades bias (λ=0: one-step TD) for variance (λ=1:
    Monte-Carlo return minus V). verl's defaults are γ = λ = 1.
    """
    num_rows, num_tokens = check_token_fields(
        token_level_rewards=token_level_rewards, values=values, response_mask=response_mask
    )
    is_action = response_mask.bool()
    next_value = values.new_zeros(num_rows)  # [N] V of the next action token
    next_advantage = values.new_zeros(num_rows)  # [N] Â of the next action token
    columns = []
    for t in reversed(range(num_tokens)):
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        advantage_t = delta + gamma * lam * next_advantage
        next_value = torch.where(is_action[:, t], values[:, t], next_value)
        next_advantage = torch.where(is_action[:, t], advantage_t, next_advantage)
        columns.append(next_advantage)
    advantages = torch.stack(columns[::-1], dim=1)  # [N, T]
    returns = advantages + values
    return masked_whiten(advantages, response_mask), returns
