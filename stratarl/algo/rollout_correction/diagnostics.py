"""Layer 6, RL math: off-policy diagnostics between the training policy and the rollout policy
(verl's `compute_offpolicy_metrics`): perplexities, KL estimates and χ² divergences.

Computed per micro-batch by the actor (π_θ vs π_rollout) and once per step by the trainer
(π_old vs π_rollout); logged under `rollout_corr/`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from stratarl.algo.masked import masked_mean, masked_sum
from stratarl.algo.rollout_correction.is_weights import SAFETY_BOUND

METRIC_PREFIX = "rollout_corr/"


@torch.no_grad()
def offpolicy_metrics(
    log_prob: Tensor,  # [N, T] log π_train (π_old, or π_θ inside the actor)
    rollout_log_prob: Tensor | None,  # [N, T] log π_rollout from the inference engine
    response_mask: Tensor,  # [N, T]
) -> dict[str, float]:
    """Unprefixed metrics. With ℓ_i = masked mean of log π_train over row i (ℓʳ_i for π_rollout),
    log r = log π_train − log π_rollout, and means over rows taken over every row:

        training_ppl      = mean_i exp(−ℓ_i)          training_log_ppl = mean_i (−ℓ_i)
        rollout_ppl       = mean_i exp(−ℓʳ_i)         rollout_log_ppl  = mean_i (−ℓʳ_i)
        kl                = E_tok[−log r]  (k1 of KL(π_rollout‖π_train))
        k3_kl             = E_tok[exp(log r) − log r − 1]   (no clamp, as verl)
        log_ppl_diff      = mean_i (ℓʳ_i − ℓ_i),  log_ppl_abs_diff = mean_i |…|,  _max / _min
        ppl_ratio         = mean_i exp(ℓʳ_i − ℓ_i)
        chi2_token        = E_tok[exp(2·clamp(log r, ±20))] − 1
        chi2_seq          = mean_i exp(2·clamp(Σ_t m·log r, ±20)) − 1

    Only the training_* pair is reported when `rollout_log_prob` is None.
    """
    if not response_mask.any():
        raise ValueError("response_mask must contain at least one valid token")
    training_mean = masked_mean(log_prob, response_mask, dim=-1)  # [N]
    metrics = {
        "training_ppl": torch.exp(-training_mean).mean().item(),
        "training_log_ppl": (-training_mean).mean().item(),
    }
    if rollout_log_prob is None:
        return metrics
    if rollout_log_prob.shape != log_prob.shape:
        raise ValueError(
            f"rollout_log_prob {tuple(rollout_log_prob.shape)} must match log_prob {tuple(log_prob.shape)}"
        )
    log_ratio = log_prob - rollout_log_prob  # [N, T]
    rollout_mean = masked_mean(rollout_log_prob, response_mask, dim=-1)  # [N]
    log_ppl_diff = rollout_mean - training_mean  # [N]
    chi2_token = masked_mean(torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)).square(), response_mask)
    log_ratio_sum = masked_sum(log_ratio, response_mask, dim=-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)  # [N]
    metrics.update(
        {
            "kl": masked_mean(-log_ratio, response_mask).item(),
            "k3_kl": masked_mean(torch.exp(log_ratio) - log_ratio - 1, response_mask).item(),
            "rollout_ppl": torch.exp(-rollout_mean).mean().item(),
            "rollout_log_ppl": (-rollout_mean).mean().item(),
            "log_ppl_diff": log_ppl_diff.mean().item(),
            "log_ppl_abs_diff": log_ppl_diff.abs().mean().item(),
            "log_ppl_diff_max": log_ppl_diff.max().item(),
            "log_ppl_diff_min": log_ppl_diff.min().item(),
            "ppl_ratio": torch.exp(log_ppl_diff).mean().item(),
            "chi2_token": (chi2_token - 1.0).item(),
            "chi2_seq": (torch.exp(2.0 * log_ratio_sum).mean() - 1.0).item(),
        }
    )
    return metrics


def with_prefix(metrics: dict[str, float], prefix: str = METRIC_PREFIX) -> dict[str, float]:
    """{prefix + name: value}: how the rollout-correction metrics are logged (`rollout_corr/kl`, …)."""
    return {f"{prefix}{name}": value for name, value in metrics.items()}


def rollout_corr_metrics(
    log_prob: Tensor, rollout_log_prob: Tensor, response_mask: Tensor
) -> dict[str, float]:
    """`rollout_corr/*` diagnostics of the current policy against the rollout policy (the actor's call,
    verl's `compute_rollout_corr_metrics_from_logprobs`)."""
    return with_prefix(offpolicy_metrics(log_prob, rollout_log_prob, response_mask))
