"""Layer 6, RL math: advantages normalized within a prompt's group, GRPO and its relatives.

Each trajectory's outcome R_i = Σ_t r_it is compared with the other samples of its prompt (same
`group` id) and divided by the group's spread: GRPO, Dr. GRPO, GRPO pass@k, and GDPO (GRPO per
reward component). The scalar advantage is broadcast over the trajectory's action tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from stratarl.algo.advantages.inputs import check_grouped_outcome, check_row_field, check_token_fields
from stratarl.algo.groups import (
    check_group,
    group_count,
    group_max,
    group_mean,
    group_min,
    group_size,
    group_std,
)
from stratarl.algo.masked import masked_whiten


def group_normalized_scores(
    scores: Tensor,  # [N] R_i
    group: Tensor,  # [N] group ids
    *,
    norm_adv_by_std: bool = True,
    eps: float = 1e-6,
) -> Tensor:  # [N]
    """Â_i = (R_i − μ_g) / (σ_g + ε), or R_i − μ_g when norm_adv_by_std is False (Dr. GRPO).

    σ_g is the unbiased (Bessel) standard deviation. A group of one has no peers: it gets μ = 0 and
    σ = 1, so its advantage is R_i / (1 + ε) (or R_i), as in verl.
    """
    mean, std = group_normalization(scores, group)
    if not norm_adv_by_std:
        return scores - mean
    return (scores - mean) / (std + eps)


def group_normalization(scores: Tensor, group: Tensor) -> tuple[Tensor, Tensor]:  # [N], [N]
    """The μ_g and σ_g of `group_normalized_scores`, per row: the group's mean and unbiased std, or
    μ = 0, σ = 1 for a group of one."""
    is_alone = group_size(group, scores.dtype).to(scores.device) < 2
    mean = torch.where(is_alone, torch.zeros_like(scores), group_mean(scores, group))
    std = torch.where(is_alone, torch.ones_like(scores), group_std(scores, group))
    return mean, std


@torch.no_grad()
def grpo_statistics(
    token_level_rewards: Tensor,  # [N, T]
    response_mask: Tensor,  # [N, T]
    group: Tensor,  # [N] group ids
    *,
    norm_adv_by_std: bool = True,
    eps: float = 1e-6,
) -> dict[str, Any]:
    """What `grpo_advantages` computed each row's Â_i from, for a reader to redo it by hand:
    `score` R_i [N], `mean` μ_g [N], `std` σ_g [N] (unbiased; 1 for a group of one), `eps` ε and
    `norm_adv_by_std`. Â_i = (score − mean) / (std + eps), or score − mean without the division."""
    check_grouped_outcome(token_level_rewards, response_mask, group)
    scores = token_level_rewards.sum(dim=-1)  # [N]
    mean, std = group_normalization(scores, group)
    return {"score": scores, "mean": mean, "std": std, "eps": eps, "norm_adv_by_std": norm_adv_by_std}


@torch.no_grad()
def grpo_advantages(
    token_level_rewards: Tensor,  # [N, T]
    response_mask: Tensor,  # [N, T]
    group: Tensor,  # [N] group ids
    *,
    norm_adv_by_std: bool = True,
    eps: float = 1e-6,
) -> tuple[Tensor, Tensor]:  # advantages [N, T], returns [N, T] (equal)
    """Group-relative advantage (GRPO, Shao et al. 2024, arXiv:2402.03300):

        R_i = Σ_t r_it,    Â_i = (R_i − mean_g R) / (std_g R + ε),    A_it = Â_i · m_it.

    norm_adv_by_std=False drops the division: Â_i = R_i − mean_g R (Dr. GRPO, arXiv:2503.20783).
    std is unbiased; a group of one gets mean 0 and std 1. R_i sums the whole row, mask or not
    (rewards sit on the last action token). returns equal the advantages (there is no critic).
    verl's `grpo_vectorized` computes the same quantity and is registered as an alias.
    """
    check_grouped_outcome(token_level_rewards, response_mask, group)
    scores = token_level_rewards.sum(dim=-1)  # [N]
    advantages = group_normalized_scores(scores, group, norm_adv_by_std=norm_adv_by_std, eps=eps)
    advantages = advantages.unsqueeze(-1) * response_mask  # [N, T]
    return advantages, advantages.clone()


@torch.no_grad()
def grpo_passk_advantages(
    token_level_rewards: Tensor,  # [N, T]
    response_mask: Tensor,  # [N, T]
    group: Tensor,  # [N] group ids
    *,
    norm_adv_by_std: bool = True,
    eps: float = 1e-6,
) -> tuple[Tensor, Tensor]:  # advantages [N, T], returns [N, T] (equal)
    """Pass@k training (Chen et al. 2025, arXiv:2503.19595): only the best sample of a group learns.

        Â_i = (R_(1) − R_(2)) / (std_g R + ε)   for the arg-max i of its group,   Â_j = 0 otherwise,

    with R_(1) ≥ R_(2) the two largest outcomes of the group (a tie gives 0). norm_adv_by_std=False
    drops the division. Every group needs at least 2 samples; a group of one raises ValueError.
    """
    check_grouped_outcome(token_level_rewards, response_mask, group)
    scores = token_level_rewards.sum(dim=-1)  # [N]
    index = group.to(scores.device)
    counts = group_count(group)
    if bool(((counts > 0) & (counts < 2)).any()):
        lonely = int(((counts > 0) & (counts < 2)).nonzero()[0])
        raise ValueError(f"grpo_passk needs at least 2 samples per group; group {lonely} has 1")
    rows = torch.arange(scores.shape[0], device=scores.device)
    best = group_max(scores, index)  # [G] R_(1)
    # The winner is the first row that reaches its group's maximum (ties give Â = 0 either way).
    is_candidate = scores == best[index]
    winner = group_min(torch.where(is_candidate, rows, scores.shape[0]), index)  # [G] row index
    is_winner = rows == winner[index]
    runner_up = group_max(torch.where(is_winner, -torch.inf, scores), index)  # [G] R_(2)
    advantage = best[index] - runner_up[index]
    if norm_adv_by_std:
        advantage = advantage / (group_std(scores, group) + eps)
    advantages = torch.where(is_winner, advantage, torch.zeros_like(scores))
    advantages = advantages.unsqueeze(-1) * response_mask
    return advantages, advantages.clone()


@torch.no_grad()
def gdpo_advantages(
    component_scores: Mapping[str, Tensor | np.ndarray] | Sequence[Tensor | np.ndarray],  # K × [N]
    response_mask: Tensor,  # [N, T]
    group: Tensor,  # [N] group ids
    *,
    weights: Sequence[float] | None = None,  # K weights, default all 1
    norm_adv_by_std: bool = True,
    eps: float = 1e-6,
) -> tuple[Tensor, Tensor]:  # advantages [N, T], returns [N, T] (equal)
    """Group reward-Decoupled normalization (GDPO, arXiv:2601.05242): GRPO per reward component.

        Â^k_i = (R^k_i − mean_g R^k) / (std_g R^k + ε)        for each component k (e.g. format, accuracy)
        A_it = masked_whiten(Σ_k w_k Â^k_i · m_it) · m_it      whitened over every action token of the batch

    Normalizing each component before summing keeps a large-scale reward from drowning a small one.
    `component_scores` holds one [N] outcome per component (a dict in the order of verl's
    `gdpo_reward_keys`, or a list); they are cast to float32 as verl does. `weights` follows the
    same order (verl's `gdpo_reward_weights`). To reproduce verl's fallback without reward keys,
    pass the single component `[token_level_rewards.sum(-1)]`. A group of one gets mean 0, std 1.
    Departure: a `weights` list whose length differs from the number of components raises
    ValueError here; verl indexes it blindly (IndexError if short, extra weights ignored).
    """
    if isinstance(component_scores, Mapping):
        component_scores = list(component_scores.values())
    components = list(component_scores)
    if not components:
        raise ValueError("gdpo needs at least one reward component in component_scores")
    num_rows, _ = check_token_fields(response_mask=response_mask)
    check_group(group, num_rows)
    weights = [1.0] * len(components) if weights is None else list(weights)
    if len(weights) != len(components):
        raise ValueError(f"gdpo got {len(weights)} weights for {len(components)} reward components")
    weight = torch.tensor(weights, dtype=torch.float32, device=response_mask.device)  # [K]
    total = torch.zeros(num_rows, dtype=torch.float32, device=response_mask.device)  # [N]
    for k, component in enumerate(components):
        scores = _as_float32(component, response_mask.device)
        check_row_field(f"component_scores[{k}]", scores, num_rows)
        total = total + weight[k] * group_normalized_scores(
            scores, group, norm_adv_by_std=norm_adv_by_std, eps=eps
        )
    advantages = masked_whiten(total.unsqueeze(-1) * response_mask, response_mask) * response_mask
    return advantages, advantages.clone()


def _as_float32(values: Tensor | np.ndarray, device: torch.device) -> Tensor:
    """A reward component as a float32 tensor (non-tensor batch columns arrive as numpy object arrays)."""
    if isinstance(values, Tensor):
        return values.to(device=device, dtype=torch.float32)
    return torch.from_numpy(np.asarray(values, dtype=np.float32)).to(device)
