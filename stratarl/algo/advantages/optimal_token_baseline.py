"""Layer 6, RL math: the optimal token baseline (OTB), a per-timestep baseline shared by a group.

Instead of one baseline per trajectory, every timestep t of a prompt's group gets the baseline
that minimizes the policy-gradient variance, weighting each sample by how much gradient "energy"
its path has accumulated up to t. TIR-OTB is the multi-turn form: tool tokens are squeezed out
first, so the k-th action token of one trajectory is compared with the k-th of the others.
"""

from __future__ import annotations

import torch
from torch import Tensor

from stratarl.algo.advantages.inputs import check_token_fields
from stratarl.algo.groups import check_group, group_max, group_sum


def path_variance_weights(
    old_log_prob: Tensor,  # [N, T] log π(y_t)
    sum_pi_squared: Tensor,  # [N, T] Σ_v π(v)² at each position
    response_mask: Tensor,  # [N, T]
    rollout_is_weights: Tensor | None = None,  # [N, T] ρ̄_t, truncated IS weights
) -> Tensor:  # [N, T]
    """W_t = Σ_{j≤t} m_j·w_j with w_j = (1 − 2π_j + Σ_v π_v²)·ρ̄_j² (ρ̄ = 1 without IS weights).

    w_j = ‖∇ log π(y_j)‖² of the softmax logits, the squared score norm at step j; W_t is its
    running sum along the path, the variance proxy of the trajectory prefix.
    """
    step = 1 - 2 * torch.exp(old_log_prob) + sum_pi_squared
    if rollout_is_weights is not None:
        step = step * rollout_is_weights**2
    return torch.where(response_mask.bool(), step, torch.zeros_like(step)).cumsum(dim=-1)


def reward_to_go(token_level_rewards: Tensor, response_mask: Tensor) -> Tensor:
    """G_t = Σ_{s≥t} r_s·m_s, undiscounted: [N, T] -> [N, T]."""
    kept = torch.where(response_mask.bool(), token_level_rewards, torch.zeros_like(token_level_rewards))
    return kept.flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])


def group_token_baselines(
    returns: Tensor,  # [N, T] G_t
    weights: Tensor,  # [N, T] W_t
    response_mask: Tensor,  # [N, T]
    group: Tensor,  # [N] group ids
    *,
    is_member: Tensor,  # [N] bool, rows counted in their group's size and length ranking
    handle_zero_tail: bool,
    eps: float,
) -> Tensor:  # [N, T] B_t of each row's group
    """B_gt = Σ_{i∈g} G_it·W_it·m_it / (Σ_{i∈g} W_it·m_it + ε) for groups of ≥ 2 members, else 0.

    handle_zero_tail: when one member is strictly the longest (length = Σ_t m_t), it has no peer
    past the second-longest length L₂, so its baseline is set to 0 from column L₂ on.
    """
    mask = response_mask.to(returns.dtype)
    index = group.to(returns.device)
    numerator = group_sum(returns * weights * mask, index)  # [G, T]
    denominator = group_sum(weights * mask, index) + eps  # [G, T]
    members = is_member.to(returns.dtype)
    has_peers = (group_sum(members, index) >= 2)[index]  # [N]
    baselines = torch.where(has_peers[:, None], (numerator / denominator)[index], torch.zeros_like(returns))
    if not handle_zero_tail:
        return baselines
    length = mask.sum(dim=-1)  # [N]
    longest = group_max(torch.where(is_member, length, -1.0), index)  # [G]
    is_longest = is_member & (length == longest[index])
    is_unique_longest = is_longest & (group_sum(is_longest.to(returns.dtype), index) == 1)[index] & has_peers
    second = group_max(torch.where(is_member & ~is_longest, length, -1.0), index)  # [G] L₂
    columns = torch.arange(returns.shape[1], device=returns.device)
    in_tail = is_unique_longest[:, None] & (columns[None, :] >= second[index][:, None])
    return torch.where(in_tail, torch.zeros_like(baselines), baselines)


@torch.no_grad()
def optimal_token_baseline_advantages(
    token_level_rewards: Tensor,  # [N, T]
    response_mask: Tensor,  # [N, T]
    group: Tensor,  # [N] group ids
    old_log_prob: Tensor,  # [N, T]
    sum_pi_squared: Tensor,  # [N, T]
    rollout_is_weights: Tensor | None = None,  # [N, T]
    *,
    handle_zero_tail: bool = True,
    eps: float = 1e-8,
) -> tuple[Tensor, Tensor]:  # advantages [N, T], returns [N, T]
    """Optimal token baseline (verl's OTB): A_t = (G_t − B_t)·m_t, returns = G.

        G_t = Σ_{s≥t} r_s·m_s,      B_t = Σ_{i∈g} G_it·W_it / (Σ_{i∈g} W_it + ε)   (over action tokens)

    with W_t from `path_variance_weights`; B_t = E[G_t·W_t] / E[W_t] is the variance-minimizing
    baseline when the per-step score norms are used as the variance proxy. A group of one has no
    baseline (A = G). Timesteps are response columns, so with multi-turn masks the columns of
    different samples need not line up: use `tir_optimal_token_baseline_advantages` there.
    handle_zero_tail (default True since verl 0.9.1): see `group_token_baselines`.
    returns = G unmasked (a mask-0 position holds the later reward-to-go), as in verl.
    """
    returns, weights = _returns_and_weights(
        token_level_rewards, response_mask, group, old_log_prob, sum_pi_squared, rollout_is_weights
    )
    every_row = torch.ones(returns.shape[0], dtype=torch.bool, device=returns.device)
    baselines = group_token_baselines(
        returns,
        weights,
        response_mask,
        group,
        is_member=every_row,
        handle_zero_tail=handle_zero_tail,
        eps=eps,
    )
    return (returns - baselines) * response_mask, returns


@torch.no_grad()
def tir_optimal_token_baseline_advantages(
    token_level_rewards: Tensor,  # [N, T]
    response_mask: Tensor,  # [N, T]
    group: Tensor,  # [N] group ids
    old_log_prob: Tensor,  # [N, T]
    sum_pi_squared: Tensor,  # [N, T]
    rollout_is_weights: Tensor | None = None,  # [N, T]
    *,
    handle_zero_tail: bool = True,
    eps: float = 1e-8,
) -> tuple[Tensor, Tensor]:  # advantages [N, T], returns [N, T]
    """OTB for tool-integrated (multi-turn) responses: the baseline is indexed by action-token count.

    G and W are computed on the full rows as in `optimal_token_baseline_advantages`, then the
    action tokens of each row are packed to the left (k = 0..L_i−1, observation tokens dropped),
    B is computed per group and packed position k, and A = G − B is scattered back to the action
    tokens. Rows with no action token take no part in their group (size, length ranking).
    returns = G on the full rows, unmasked, as in verl.
    """
    returns, weights = _returns_and_weights(
        token_level_rewards, response_mask, group, old_log_prob, sum_pi_squared, rollout_is_weights
    )
    rows, columns = response_mask.bool().nonzero(as_tuple=True)  # action tokens
    packed_column = (response_mask.bool().long().cumsum(dim=-1) - 1)[rows, columns]  # k of each one
    length = response_mask.bool().sum(dim=-1)  # [N] L_i
    width = int(length.max()) if length.numel() else 0
    packed_mask = torch.arange(width, device=length.device)[None, :] < length[:, None]  # [N, K]
    packed_returns = _pack(returns, (rows, columns), (rows, packed_column), width)  # [N, K]
    packed_weights = _pack(weights, (rows, columns), (rows, packed_column), width)  # [N, K]
    baselines = group_token_baselines(
        packed_returns,
        packed_weights,
        packed_mask,
        group,
        is_member=length > 0,
        handle_zero_tail=handle_zero_tail,
        eps=eps,
    )
    packed_advantages = packed_returns - baselines  # [N, K]
    advantages = _pack(packed_advantages, (rows, packed_column), (rows, columns), returns.shape[1])
    return advantages * response_mask, returns


def _returns_and_weights(
    token_level_rewards: Tensor,  # [N, T]
    response_mask: Tensor,  # [N, T]
    group: Tensor,  # [N]
    old_log_prob: Tensor,  # [N, T]
    sum_pi_squared: Tensor,  # [N, T]
    rollout_is_weights: Tensor | None,  # [N, T]
) -> tuple[Tensor, Tensor]:  # G [N, T], W [N, T]
    """Both OTB variants' start: the inputs checked, then G (`reward_to_go`) and W
    (`path_variance_weights`) on the full rows."""
    check_token_fields(
        token_level_rewards=token_level_rewards,
        response_mask=response_mask,
        old_log_prob=old_log_prob,
        sum_pi_squared=sum_pi_squared,
        rollout_is_weights=rollout_is_weights,
    )
    check_group(group, token_level_rewards.shape[0])
    returns = reward_to_go(token_level_rewards, response_mask)
    weights = path_variance_weights(old_log_prob, sum_pi_squared, response_mask, rollout_is_weights)
    return returns, weights


def _pack(values: Tensor, source: tuple[Tensor, Tensor], target: tuple[Tensor, Tensor], width: int) -> Tensor:
    """A new [N, width] tensor, 0 except out[target] = values[source] (moves tokens between layouts)."""
    return values.new_zeros(values.shape[0], width).index_put(target, values[source])
