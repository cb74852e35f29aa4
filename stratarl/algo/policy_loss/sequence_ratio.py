"""Layer 6, RL math: losses whose importance ratio is one number per sequence, the geometric mean
of the token ratios: GSPO (verl's `gspo`) and GMPO (verl's `geo_mean`).

GSPO: Zheng et al., arXiv:2507.18071. GMPO: Zhao et al., arXiv:2507.20673.
"""

from __future__ import annotations

import torch
from torch import Tensor

from stratarl.algo.masked import masked_mean, masked_sum
from stratarl.algo.policy_loss.inputs import check_loss_inputs, ppo_kl, weight_by_rollout_is, zero_metric
from stratarl.algo.policy_loss.output import PolicyLossOutput

# verl's guard on GSPO's log sequence ratio (upper side only): exp(10) ≈ 2.2e4.
GSPO_LOG_RATIO_MAX = 10.0
# verl's epsilons in GMPO's per-sequence means and in the log of its IS weights.
GMPO_LENGTH_EPS = 1e-8
GMPO_IS_LOG_EPS = 1e-10


def gspo_loss(
    *,
    log_prob: Tensor,  # [N, T]
    old_log_prob: Tensor,  # [N, T]
    advantages: Tensor,  # [N, T]
    response_mask: Tensor,  # [N, T]
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    rollout_is_weights: Tensor | None = None,  # [N, T]
) -> PolicyLossOutput:
    """Clipped surrogate on the length-normalized sequence ratio s_i, carried token by token.

        log s_i  = Σ_t m_it·(log π − log π_old)_it / max(Σ_t m_it, 1)       (no ±20 clamp)
        log s_it = min(sg(log s_i) + log π_it − sg(log π_it), 10)
        ℓ_it     = max(−A_it·s_it, −A_it·clip(s_it, 1 − ε_low, 1 + ε_high)) · w_it

    s_it equals s_i in value; its gradient is s_i·∇log π_it, token by token (sg = stop-gradient).
    The paper averages over each sequence first (seq-mean-token-mean); verl 0.9.1 aggregates with
    the actor's `loss_agg_mode` (default token-mean), and so does this registry entry.
    Metrics: pg_clipfrac = share where the clip binds, ppo_kl, pg_clipfrac_lower = 0 (no dual clip).
    """
    check_loss_inputs(log_prob, old_log_prob, advantages, response_mask, rollout_is_weights)
    mask = response_mask.to(log_prob.dtype)
    log_ratio = log_prob - old_log_prob
    seq_lengths = mask.sum(dim=-1).clamp(min=1)  # [N]
    seq_log_ratio = masked_sum(log_ratio, mask, dim=-1) / seq_lengths  # [N]
    token_log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    seq_ratio = torch.exp(torch.clamp(token_log_ratio, max=GSPO_LOG_RATIO_MAX))  # [N, T]

    unclipped = -advantages * seq_ratio
    clipped = -advantages * torch.clamp(seq_ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    per_token = torch.maximum(unclipped, clipped)
    metrics = {
        "pg_clipfrac": masked_mean((clipped > unclipped).float(), response_mask).detach(),
        "ppo_kl": ppo_kl(log_ratio, response_mask),
        "pg_clipfrac_lower": zero_metric(log_prob),
    }
    return PolicyLossOutput(weight_by_rollout_is(per_token, rollout_is_weights), metrics)


def geo_mean_loss(
    *,
    log_prob: Tensor,  # [N, T]
    old_log_prob: Tensor,  # [N, T]
    advantages: Tensor,  # [N, T]; GMPO assumes one advantage per sequence
    response_mask: Tensor,  # [N, T]
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    rollout_is_weights: Tensor | None = None,  # [N, T]
) -> PolicyLossOutput:
    """GMPO: a sequence loss on the geometric mean of token ratios clipped in log space.

        log r_it  = log π − log π_old                                         (no ±20 clamp)
        log r̃_it = sign(A)·min(sign(A)·log r, sign(A)·clip(log r, −ε_low, ε_high))
        ρ_i = exp(Σ_t m·log r̃ / (Σ_t m + 1e-8)),  Ā_i = Σ_t m·A / (Σ_t m + 1e-8)
        L_i = −Ā_i·ρ_i·w_i,  w_i = exp(Σ_t m·log(w_it + 1e-10) / (Σ_t m + 1e-8))  (geometric mean)

    verl returns mean_i L_i over all N rows of the micro-batch and ignores `loss_agg_mode`, dp_size
    and the global counts. The per-token form spreads L_i evenly over the valid tokens of row i,
    ℓ_it = L_i·m_it / max(Σ_t m_it, 1), so that seq-mean-token-sum with global_batch_size = N
    and dp_size = 1 (what the registry entry declares) gives verl's number.
    Metrics: pg_clipfrac = share of tokens with A > 0 whose log r was clipped, pg_clipfrac_lower =
    the same for A < 0, ppo_kl.
    """
    check_loss_inputs(log_prob, old_log_prob, advantages, response_mask, rollout_is_weights)
    mask = response_mask.to(log_prob.dtype)
    log_ratio = log_prob - old_log_prob
    sign = torch.sign(advantages)
    clamped = torch.clamp(log_ratio, -clip_ratio_low, clip_ratio_high)
    clipped_log_ratio = sign * torch.minimum(sign * log_ratio, sign * clamped)

    lengths = mask.sum(dim=-1)  # [N]
    seq_ratio = torch.exp(masked_sum(clipped_log_ratio, mask, dim=-1) / (lengths + GMPO_LENGTH_EPS))  # [N]
    seq_advantage = masked_sum(advantages, mask, dim=-1) / (lengths + GMPO_LENGTH_EPS)  # [N]
    seq_loss = -seq_advantage * seq_ratio  # [N]
    if rollout_is_weights is not None:
        log_weights = masked_sum(torch.log(rollout_is_weights + GMPO_IS_LOG_EPS), mask, dim=-1)  # [N]
        seq_loss = seq_loss * torch.exp(log_weights / (lengths + GMPO_LENGTH_EPS))
    per_token = seq_loss.unsqueeze(-1) * mask / lengths.clamp(min=1).unsqueeze(-1)

    was_clipped = (log_ratio != clamped).float()
    metrics = {
        "pg_clipfrac": masked_mean(was_clipped * (advantages > 0), response_mask).detach(),
        "ppo_kl": ppo_kl(log_ratio, response_mask),
        "pg_clipfrac_lower": masked_mean(was_clipped * (advantages < 0), response_mask).detach(),
    }
    return PolicyLossOutput(per_token, metrics)
