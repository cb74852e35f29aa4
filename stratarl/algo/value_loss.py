"""Layer 6, RL math: the critic's clipped value loss and the explained variance of its predictions.

The loss is returned per token; the critic aggregates it with `algo.aggregation.aggregate_loss`
(verl's `agg_loss`) like every other loss, so the loss_agg_mode and global token counts apply to it
in the same visible step.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from stratarl.algo.masked import masked_mean


def clipped_value_loss(
    vpreds: Tensor,  # [N, T] V_θ(s_t), the critic's current predictions
    returns: Tensor,  # [N, T] R_t, the regression targets
    values: Tensor,  # [N, T] V_old(s_t), the predictions when the batch was collected
    response_mask: Tensor,  # [N, T]
    *,
    cliprange_value: float = 0.5,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token clipped value loss [N, T] (PPO, arXiv:1707.06347; verl's `compute_value_loss`):

        v_clip = clip(V_θ, V_old − c, V_old + c)
        ℓ_t    = ½ · max((V_θ − R)², (v_clip − R)²)

    verl computes ½·agg(max(…)); aggregation is linear in the loss and ×½ is exact in floating point,
    so `aggregate_loss(ℓ, response_mask, mode, …)` gives verl's vf_loss. Positions outside the mask
    are computed too; the aggregation ignores them.

    Metrics: `vf_clipfrac` = masked mean of [(v_clip − R)² > (V_θ − R)²], detached.
    """
    for name, tensor in (("returns", returns), ("values", values), ("response_mask", response_mask)):
        if tensor.shape != vpreds.shape:
            raise ValueError(f"{name} {tuple(tensor.shape)} must match vpreds {tuple(vpreds.shape)}")
    vpreds_clipped = torch.max(torch.min(vpreds, values + cliprange_value), values - cliprange_value)
    loss_unclipped = (vpreds - returns).square()
    loss_clipped = (vpreds_clipped - returns).square()
    loss = 0.5 * torch.max(loss_unclipped, loss_clipped)
    clipfrac = masked_mean(torch.gt(loss_clipped, loss_unclipped).float(), response_mask)
    return loss, {"vf_clipfrac": clipfrac.detach()}


def explained_variance(returns: Tensor, values: Tensor, response_mask: Tensor) -> float:
    """critic/vf_explained_var = 1 − Var(R − V) / (Var(R) + 1e-5) over the valid tokens (verl's form).

    Var is the unbiased variance of the masked elements (torch.var). 1 means V predicts R exactly,
    0 means V is no better than a constant. With fewer than two valid tokens the variance is undefined
    and the result is NaN (verl gives NaN too, for an empty mask).
    """
    if returns.shape != values.shape or returns.shape != response_mask.shape:
        raise ValueError(
            f"returns {tuple(returns.shape)}, values {tuple(values.shape)} and response_mask "
            f"{tuple(response_mask.shape)} must match"
        )
    valid = response_mask.bool()
    valid_returns = returns[valid].detach()
    if valid_returns.numel() < 2:
        return math.nan
    valid_values = values[valid].detach()
    residual_var = torch.var(valid_returns - valid_values)
    return (1.0 - residual_var / (torch.var(valid_returns) + 1e-5)).item()
