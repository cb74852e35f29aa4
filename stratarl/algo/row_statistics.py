"""Layer 6, RL math: what one policy update did to each trajectory — the trace's question 9.

Per row of a micro-batch, over its action tokens, from the update's own forward (log π_θ) and the
batch's log π_old: the new log-prob, the importance ratio and the share of tokens the PPO clip
bound holds. Aggregate metrics (`actor/pg_clipfrac`, `actor/ppo_kl`) are these over all tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from stratarl.algo.masked import masked_mean, masked_sum
from stratarl.algo.policy_loss.inputs import check_loss_inputs, clamped_log_ratio


@torch.no_grad()
def ratio_statistics_per_row(
    *,
    log_prob: Tensor,  # [N, T] log π_θ of the sampled tokens, from the update's forward
    old_log_prob: Tensor,  # [N, T] log π_old
    advantages: Tensor,  # [N, T]
    response_mask: Tensor,  # [N, T] 1 on action tokens
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
) -> dict[str, Tensor]:
    """[N] statistics per trajectory, with m_t the mask, r_t = exp(clamp(log π_θ − log π_old, ±20)):

        tokens            = Σ_t m_t
        new_log_prob_mean = Σ_t m_t·log π_θ / Σ_t m_t
        log_ratio_mean    = Σ_t m_t·log r_t / Σ_t m_t       (= new − old when no clamp binds)
        ratio_mean        = Σ_t m_t·r_t / Σ_t m_t,  ratio_min / ratio_max over the action tokens
        clipped_share     = share of action tokens with
                            (A_t > 0 ∧ r_t > 1 + ε_high) ∨ (A_t < 0 ∧ r_t < 1 − ε_low)

    clipped_share is the token indicator of `actor/pg_clipfrac` for PPO's clip (ε_low, ε_high). A row
    without action tokens (a zero-weight pad row) has tokens 0 and NaN elsewhere.
    """
    check_loss_inputs(log_prob, old_log_prob, advantages, response_mask)
    mask = response_mask.to(torch.float32)
    tokens = mask.sum(-1)  # [N]
    log_ratio = clamped_log_ratio(log_prob.float(), old_log_prob.float())
    ratio = torch.exp(log_ratio)
    clipped = ((advantages > 0) & (ratio > 1 + clip_ratio_high)) | (
        (advantages < 0) & (ratio < 1 - clip_ratio_low)
    )
    has_tokens = tokens > 0
    nan = torch.full_like(tokens, float("nan"))
    big = torch.finfo(torch.float32).max
    ratio_min = torch.where(mask.bool(), ratio, big).amin(-1)
    ratio_max = torch.where(mask.bool(), ratio, -big).amax(-1)
    stats = {
        "new_log_prob_mean": masked_mean(log_prob.float(), mask, dim=-1),
        "log_ratio_mean": masked_mean(log_ratio, mask, dim=-1),
        "ratio_mean": masked_sum(ratio, mask, dim=-1) / tokens.clamp(min=1),
        "ratio_min": ratio_min,
        "ratio_max": ratio_max,
        "clipped_share": masked_mean(clipped.float(), mask, dim=-1),
    }
    out = {name: torch.where(has_tokens, value, nan) for name, value in stats.items()}
    out["tokens"] = tokens
    return out
