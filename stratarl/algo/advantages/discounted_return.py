"""Layer 6, RL math: critic-free advantages from each token's reward-to-go G_t.

REINFORCE++ whitens the discounted return over the batch; ReMax subtracts the score of a greedy
rollout of the same prompt. Neither needs groups of samples, nor a critic.
"""

from __future__ import annotations

import torch
from torch import Tensor

from stratarl.algo.advantages.inputs import check_row_field, check_token_fields
from stratarl.algo.masked import masked_whiten


def discounted_returns(token_level_rewards: Tensor, response_mask: Tensor, gamma: float) -> Tensor:
    """G_t = r_t + γ·G_next over action tokens, 0 on tokens with mask 0: [N, T] -> [N, T].

    G_next is the return of the next action token to the right (0 past the last one). A token with
    mask 0 stores 0 and passes G_next through unchanged, undiscounted: a tool result between two
    turns neither cuts nor shrinks the reward that flows back to the earlier turn.
    """
    is_action = response_mask.bool()
    running = token_level_rewards.new_zeros(token_level_rewards.shape[0])  # [N] G_next
    returns = torch.zeros_like(token_level_rewards)
    for t in reversed(range(token_level_rewards.shape[1])):
        candidate = token_level_rewards[:, t] + gamma * running
        returns[:, t] = torch.where(is_action[:, t], candidate, torch.zeros_like(candidate))
        running = torch.where(is_action[:, t], candidate, running)
    return returns


@torch.no_grad()
def reinforce_plus_plus_advantages(
    token_level_rewards: Tensor,  # [N, T]
    response_mask: Tensor,  # [N, T]
    *,
    gamma: float = 1.0,
) -> tuple[Tensor, Tensor]:  # advantages [N, T], returns [N, T]
    """REINFORCE++ (Hu et al. 2025, arXiv:2501.03262): batch-whitened discounted returns.

        G_t = r_t + γ·G_next  (see `discounted_returns`),     A = masked_whiten(G, m) · m

    returns = G. The whitening uses the mean and unbiased variance of G over every action token of
    the batch, and needs ≥ 2 action tokens. This is verl 0.9.1's multi-turn behaviour: the return
    passes through observation tokens (mask 0), which get return 0. (Until 0.9, verl reset the
    running return at every mask-0 token, so a reward never reached a turn before a tool result.)
    """
    check_token_fields(token_level_rewards=token_level_rewards, response_mask=response_mask)
    returns = discounted_returns(token_level_rewards, response_mask, gamma)
    advantages = masked_whiten(returns, response_mask) * response_mask
    return advantages, returns


@torch.no_grad()
def remax_advantages(
    token_level_rewards: Tensor,  # [N, T]
    response_mask: Tensor,  # [N, T]
    reward_baselines: Tensor,  # [N] score of the greedy rollout of the same prompt
) -> tuple[Tensor, Tensor]:  # advantages [N, T], returns [N, T]
    """ReMax (Li et al. 2023, arXiv:2310.10505): the greedy response's score as the baseline.

        G_t = Σ_{s≥t} r_s·m_s,        A_t = G_t − b·m_t,

    with b = `reward_baselines`, the reward of a greedy (argmax) decode of the prompt, produced by the
    trainer's extra generation pass. returns = G (undiscounted reward-to-go over action tokens).
    As in verl, a position with mask 0 keeps G_t (not zeroed): the reward-to-go of later turns on an
    observation token inside a multi-turn response, and 0 on right padding.
    """
    num_rows, _ = check_token_fields(token_level_rewards=token_level_rewards, response_mask=response_mask)
    check_row_field("reward_baselines", reward_baselines, num_rows)
    kept = torch.where(response_mask.bool(), token_level_rewards, torch.zeros_like(token_level_rewards))
    returns = kept.flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])  # [N, T] reward-to-go
    advantages = returns - reward_baselines.unsqueeze(-1) * response_mask
    return advantages, returns
