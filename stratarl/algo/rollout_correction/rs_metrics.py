"""Layer 6, RL math: the `rollout_rs_<option>_*` statistics of one rejection-sampling option
(verl's `compute_rs_metrics` plus its masked fractions), kept apart from the masking itself.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from stratarl.algo.masked import masked_mean
from stratarl.algo.rollout_correction.is_weights import masked_moment_std


def rejection_option_metrics(
    option: str,
    stat: Tensor,  # [N, T] the statistic compared with the bounds (a row's value repeated at seq level)
    response_mask: Tensor,  # [N, T]
    keep: Tensor,  # [N, T] bool, the option's verdict per token
    *,
    sequence_stat: Tensor | None,  # [N] for sequence-level options, None for token-level ones
    upper: float,
    lower: float | None,  # k1 options only; k1 bounds are in log space here
) -> dict[str, float]:
    """Statistic summaries, threshold fractions and masked fractions for one option, verl's names.

    Sequence summaries (`_seq_*`) use rows with at least one valid token; a token-level option's row
    value is the row's masked mean. `_std` is the two-moment std of the statistic clamped to
    [lower (k1) or 0, upper].
    """
    if not response_mask.any():
        raise ValueError("response_mask must contain at least one valid token")
    prefix = f"rollout_rs_{option}"
    valid = response_mask.bool()
    row_is_valid = response_mask.sum(dim=-1) > 0  # [N]
    row_values = sequence_stat if sequence_stat is not None else masked_mean(stat, response_mask, dim=-1)
    valid_rows = row_values[row_is_valid]
    metrics = {f"{prefix}_mean": masked_mean(stat, response_mask).item()}
    if sequence_stat is not None and valid_rows.numel() > 0:
        metrics[f"{prefix}_max"] = valid_rows.max().item()
        metrics[f"{prefix}_min"] = valid_rows.min().item()
        metrics[f"{prefix}_fraction_high"] = (valid_rows > upper).float().mean().item()
        low = (valid_rows < lower).float().mean().item() if lower is not None else 0.0
    else:
        metrics[f"{prefix}_max"] = stat.masked_fill(~valid, -math.inf).max().item()
        metrics[f"{prefix}_min"] = stat.masked_fill(~valid, math.inf).min().item()
        metrics[f"{prefix}_fraction_high"] = masked_mean((stat > upper).float(), response_mask).item()
        low = masked_mean((stat < lower).float(), response_mask).item() if lower is not None else 0.0
    metrics[f"{prefix}_fraction_low"] = low
    clamp_min = lower if lower is not None else 0.0
    bounded = stat.clamp(min=clamp_min, max=upper)
    metrics[f"{prefix}_std"] = masked_moment_std(bounded, response_mask) if response_mask.sum() > 1 else 0.0
    metrics.update(_row_summary(prefix, valid_rows, upper, lower))
    metrics.update(_masked_fractions(prefix, keep, response_mask, row_is_valid, stat.dtype))
    return metrics


def _row_summary(prefix: str, valid_rows: Tensor, upper: float, lower: float | None) -> dict[str, float]:
    """`_seq_{mean,std,max,min,max_deviation,fraction_high[,fraction_low]}` over non-empty rows."""
    if valid_rows.numel() == 0:
        names = ("mean", "std", "max", "min", "max_deviation", "fraction_high", "fraction_low")
        return {f"{prefix}_seq_{name}": 0.0 for name in names}
    summary = {
        f"{prefix}_seq_mean": valid_rows.mean().item(),
        f"{prefix}_seq_std": valid_rows.std().item() if valid_rows.numel() > 1 else 0.0,
        f"{prefix}_seq_max": valid_rows.max().item(),
        f"{prefix}_seq_min": valid_rows.min().item(),
        f"{prefix}_seq_max_deviation": valid_rows.abs().max().item(),
        f"{prefix}_seq_fraction_high": (valid_rows > upper).float().mean().item(),
    }
    if lower is not None:
        summary[f"{prefix}_seq_fraction_low"] = (valid_rows < lower).float().mean().item()
    return summary


def _masked_fractions(
    prefix: str, keep: Tensor, response_mask: Tensor, row_is_valid: Tensor, dtype: torch.dtype
) -> dict[str, float]:
    """Share of valid tokens rejected, and share of non-empty rows with at least one rejected token."""
    token_fraction = masked_mean((~keep).to(dtype), response_mask).item()
    row_rejected = (~keep & response_mask.bool()).any(dim=-1) & row_is_valid  # [N]
    num_valid_rows = row_is_valid.to(dtype).sum()
    row_fraction = (row_rejected.to(dtype).sum() / num_valid_rows).item() if num_valid_rows > 0 else 0.0
    return {f"{prefix}_masked_fraction": token_fraction, f"{prefix}_seq_masked_fraction": row_fraction}
