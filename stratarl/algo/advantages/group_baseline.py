"""Layer 6, RL math: advantages that subtract a baseline built from the other samples of a prompt.

RLOO (leave-one-out mean), OPO (length-weighted mean), GPG (mean, rescaled by the share of
non-zero rewards) and REINFORCE++-baseline (mean, then batch whitening). Each trajectory's outcome
R_i = Σ_t r_it is one scalar, broadcast over its action tokens; returns equal the advantages.
"""

from __future__ import annotations

import torch
from torch import Tensor

from stratarl.algo.advantages.inputs import check_grouped_outcome
from stratarl.algo.groups import group_mean, group_size, group_sum
from stratarl.algo.masked import masked_whiten


def _leave_one_out_scores(scores: Tensor, group: Tensor) -> tuple[Tensor, Tensor]:
    """(n·R_i − Σ_{j∈g} R_j) / (n − 1) = R_i − mean of the others, and a [N] flag of groups of one."""
    size = group_size(group, scores.dtype).to(scores.device)  # [N] n of each row's group
    total = group_sum(scores, group)[group.to(scores.device)]  # [N] Σ_{j∈g} R_j
    return (size * scores - total) / (size - 1).clamp_min(1), size < 2


@torch.no_grad()
def rloo_advantages(
    token_level_rewards: Tensor,  # [N, T]
    response_mask: Tensor,  # [N, T]
    group: Tensor,  # [N] group ids
) -> tuple[Tensor, Tensor]:  # advantages [N, T], returns [N, T] (equal)
    """REINFORCE Leave-One-Out (Ahmadian et al. 2024, arXiv:2402.14740):

        Â_i = R_i − (1/(n−1)) Σ_{j∈g, j≠i} R_j = (n·R_i − Σ_{j∈g} R_j) / (n − 1).

    A group of one (n = 1) has no other sample to compare with and keeps Â_i = R_i, as verl's `rloo`.
    """
    check_grouped_outcome(token_level_rewards, response_mask, group)
    scores = token_level_rewards.sum(dim=-1)  # [N]
    leave_one_out, is_alone = _leave_one_out_scores(scores, group)
    advantages = torch.where(is_alone, scores, leave_one_out).unsqueeze(-1) * response_mask
    return advantages, advantages.clone()


@torch.no_grad()
def rloo_vectorized_advantages(
    token_level_rewards: Tensor,  # [N, T]
    response_mask: Tensor,  # [N, T]
    group: Tensor,  # [N] group ids
) -> tuple[Tensor, Tensor]:  # advantages [N, T], returns [N, T] (equal)
    """RLOO as verl's `rloo_vectorized` computes it: the same Â_i as `rloo_advantages` for n ≥ 2,
    but a group of one gets Â_i = 0 instead of R_i (no baseline, so no learning signal)."""
    check_grouped_outcome(token_level_rewards, response_mask, group)
    scores = token_level_rewards.sum(dim=-1)  # [N]
    leave_one_out, is_alone = _leave_one_out_scores(scores, group)
    advantages = torch.where(is_alone, torch.zeros_like(scores), leave_one_out).unsqueeze(-1) * response_mask
    return advantages, advantages.clone()


@torch.no_grad()
def opo_advantages(
    token_level_rewards: Tensor,  # [N, T]
    response_mask: Tensor,  # [N, T]
    group: Tensor,  # [N] group ids
) -> tuple[Tensor, Tensor]:  # advantages [N, T], returns [N, T] (equal)
    """On-Policy RL with Optimal reward baseline (OPO, Hao et al. 2025, arXiv:2505.23585):

        b_g = Σ_{i∈g} |y_i|·R_i / Σ_{i∈g} |y_i|,        Â_i = R_i − b_g,

    a length-weighted mean, |y_i| = Σ_t m_it the number of action tokens. A group of one gets b = 0.
    Departure: a group whose rows are all empty (Σ|y| = 0) gets b = 0; verl divides 0 by 0 and its
    NaN survives the mask (NaN·0 = NaN). Those rows are fully masked, so their advantages are 0 here.
    """
    check_grouped_outcome(token_level_rewards, response_mask, group)
    scores = token_level_rewards.sum(dim=-1)  # [N]
    index = group.to(scores.device)
    length = response_mask.sum(dim=-1).to(scores.dtype)  # [N] |y_i|
    weighted = group_sum(length * scores, group)[index]  # [N] Σ |y|·R of the row's group
    total_length = group_sum(length, group)[index]  # [N] Σ |y| of the row's group
    has_baseline = (group_size(group, scores.dtype).to(scores.device) >= 2) & (total_length > 0)
    baseline = torch.where(has_baseline, weighted / total_length, torch.zeros_like(scores))
    advantages = (scores - baseline).unsqueeze(-1) * response_mask
    return advantages, advantages.clone()


@torch.no_grad()
def gpg_advantages(
    token_level_rewards: Tensor,  # [N, T]
    response_mask: Tensor,  # [N, T]
    group: Tensor,  # [N] group ids
    *,
    f_norm: float = 1.0,
) -> tuple[Tensor, Tensor]:  # advantages [N, T], returns [N, T] (equal)
    """Group Policy Gradient (GPG, Chu et al. 2025, arXiv:2504.02546):

        α = N / max(#{i : R_i ≠ 0}, 1),        Â_i = α · (R_i − mean_g R) / f_norm.

    α counts non-zero outcomes over the whole batch and rescales the gradient when most samples
    earn nothing. A group of one gets mean 0. (GPG's policy loss is the `gpg` policy loss.)
    """
    check_grouped_outcome(token_level_rewards, response_mask, group)
    scores = token_level_rewards.sum(dim=-1)  # [N]
    alpha = scores.shape[0] / torch.count_nonzero(scores).clamp(min=1).to(scores.dtype)
    is_alone = group_size(group, scores.dtype).to(scores.device) < 2
    mean = torch.where(is_alone, torch.zeros_like(scores), group_mean(scores, group))
    advantages = (alpha * (scores - mean) / f_norm).unsqueeze(-1) * response_mask
    return advantages, advantages.clone()


@torch.no_grad()
def reinforce_plus_plus_baseline_advantages(
    token_level_rewards: Tensor,  # [N, T]
    response_mask: Tensor,  # [N, T]
    group: Tensor,  # [N] group ids
) -> tuple[Tensor, Tensor]:  # advantages [N, T], returns [N, T] (equal)
    """REINFORCE++-baseline (Hu et al. 2025, arXiv:2501.03262): group mean baseline, batch whitening.

        A_it = masked_whiten((R_i − mean_g R) · m, m)_it · m_it

    The whitening uses the mean and unbiased variance over every action token of the batch (so a
    long response weighs more), and needs ≥ 2 action tokens. A group of one gets mean 0.
    """
    check_grouped_outcome(token_level_rewards, response_mask, group)
    scores = token_level_rewards.sum(dim=-1)  # [N]
    is_alone = group_size(group, scores.dtype).to(scores.device) < 2
    mean = torch.where(is_alone, torch.zeros_like(scores), group_mean(scores, group))
    centered = (scores - mean).unsqueeze(-1) * response_mask  # [N, T]
    advantages = masked_whiten(centered, response_mask) * response_mask
    return advantages, advantages.clone()
