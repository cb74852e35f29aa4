"""Layer 6, RL math: Clip-Cov and KL-Cov (verl's `clip_cov`, `kl_cov`), which act on the few tokens
whose advantage and log-prob covary most, the tokens that drive entropy collapse.

Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
arXiv:2505.22617.
"""

from __future__ import annotations

import torch
from torch import Tensor

from stratarl.algo.masked import masked_mean
from stratarl.algo.policy_loss.inputs import check_loss_inputs, ppo_kl, weight_by_rollout_is
from stratarl.algo.policy_loss.output import PolicyLossOutput


def _clip_cov_selection(
    candidates: Tensor,  # [N, T] bool
    num_to_clip: int,
    generator: torch.Generator | None,
) -> Tensor:  # [N, T] bool
    """Up to `num_to_clip` candidates drawn uniformly without replacement (verl's randperm draw)."""
    positions = torch.nonzero(candidates)  # [K, 2], row-major order
    chosen = torch.zeros_like(candidates)
    if len(positions) > 0:
        order = torch.randperm(len(positions), generator=generator)  # on the CPU, as verl draws it
        positions = positions[order[: min(num_to_clip, len(positions))].to(positions.device)]
        chosen[positions[:, 0], positions[:, 1]] = True
    return chosen


def clip_cov_loss(
    *,
    log_prob: Tensor,  # [N, T]
    old_log_prob: Tensor,  # [N, T]
    advantages: Tensor,  # [N, T]
    response_mask: Tensor,  # [N, T]
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_cov_ratio: float = 0.0002,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    generator: torch.Generator | None = None,
    rollout_is_weights: Tensor | None = None,  # [N, T]
) -> PolicyLossOutput:
    """PPO clip (no dual clip, no ±20 clamp) with the gradient of a few high-covariance tokens cut.

        cov_it = (A_it − mean_m A)·(log π_it − mean_m sg(log π))
        candidates: valid tokens not already clipped by PPO with clip_cov_lb < cov < clip_cov_ub
        K = max(1, ⌊clip_cov_ratio·Σ m⌋) candidates, drawn at random, get ℓ_it = 0.

    The draw uses torch.randperm on the CPU with `generator` (a CPU torch.Generator); None uses the
    global RNG exactly as verl does, so the same seed selects the same tokens.
    Metrics: pg_clipfrac = share of valid tokens zeroed (not the PPO clip share), ppo_kl.
    """
    check_loss_inputs(log_prob, old_log_prob, advantages, response_mask, rollout_is_weights)
    if clip_cov_ratio <= 0:
        raise ValueError(f"clip_cov_ratio must be > 0, got {clip_cov_ratio}")
    valid = response_mask > 0
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    clipped_by_ppo = (clipped > unclipped) & valid

    with torch.no_grad():
        centered_adv = advantages - masked_mean(advantages, response_mask)
        cov = centered_adv * (log_prob - masked_mean(log_prob, response_mask))
        candidates = (cov > clip_cov_lb) & (cov < clip_cov_ub) & valid & ~clipped_by_ppo
        num_to_clip = max(int(clip_cov_ratio * response_mask.sum().item()), 1)
        zeroed = _clip_cov_selection(candidates, num_to_clip, generator)

    per_token = torch.where(zeroed, torch.zeros_like(unclipped), torch.maximum(unclipped, clipped))
    metrics = {
        "pg_clipfrac": masked_mean(zeroed.float(), response_mask).detach(),
        "ppo_kl": ppo_kl(log_ratio, response_mask),
    }
    return PolicyLossOutput(weight_by_rollout_is(per_token, rollout_is_weights), metrics)


def kl_cov_loss(
    *,
    log_prob: Tensor,  # [N, T]
    old_log_prob: Tensor,  # [N, T]
    advantages: Tensor,  # [N, T]
    response_mask: Tensor,  # [N, T]
    kl_cov_ratio: float = 0.0002,
    ppo_kl_coef: float = 0.1,
    rollout_is_weights: Tensor | None = None,  # [N, T]
) -> PolicyLossOutput:
    """Unclipped surrogate −A·r (no ±20 clamp), plus a KL penalty on the top-covariance tokens.

        cov over the valid tokens: (A − mean A)·(log π − mean log π), plain means, no gradient
        top K = max(1, ⌊kl_cov_ratio·#valid⌋) by cov: ℓ = −A·r + ppo_kl_coef·|log r|; others −A·r

    ppo_kl_coef defaults to 0.1, the value of verl's config (its function falls back to 1.0 only
    when the key is null). Metrics: ppo_kl = masked mean of |log r| (not of −log r).
    """
    check_loss_inputs(log_prob, old_log_prob, advantages, response_mask, rollout_is_weights)
    if kl_cov_ratio <= 0:
        raise ValueError(f"kl_cov_ratio must be > 0, got {kl_cov_ratio}")
    log_ratio = log_prob - old_log_prob
    abs_log_ratio = log_ratio.abs()
    surrogate = -advantages * torch.exp(log_ratio)

    with torch.no_grad():
        valid_flat = torch.nonzero((response_mask > 0).reshape(-1), as_tuple=True)[0]  # [M]
        penalized = torch.zeros(log_prob.numel(), dtype=torch.bool, device=log_prob.device)
        if len(valid_flat) > 0:
            adv = advantages.reshape(-1)[valid_flat].cpu()
            logp = log_prob.reshape(-1)[valid_flat].cpu()
            cov = (adv - adv.mean()) * (logp - logp.mean())
            top_k = max(1, int(len(cov) * kl_cov_ratio))
            top = torch.topk(cov, top_k, largest=True).indices.to(valid_flat.device)
            penalized[valid_flat[top]] = True
        penalized = penalized.reshape(log_prob.shape)

    per_token = torch.where(penalized, surrogate + ppo_kl_coef * abs_log_ratio, surrogate)
    metrics = {"ppo_kl": masked_mean(abs_log_ratio, response_mask).detach()}
    return PolicyLossOutput(weight_by_rollout_is(per_token, rollout_is_weights), metrics)
