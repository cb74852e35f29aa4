"""Layer 6, RL math: importance weights ρ = π_train / π_rollout that correct for an off-policy rollout.

verl's `compute_rollout_correction_weights` / `compute_is_metrics` (rollout_corr_helper, verl 0.9):
token- or sequence-level weights, computed in log space with a safety bound, then truncated from
above (TIS) or zeroed outside [lower, upper] (IcePop), optionally rescaled to batch mean 1.
Weights are detached: they change the measure, not the objective.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from stratarl.algo.masked import masked_mean, masked_sum

# exp(±20) ≈ 4.9e8 / 2.1e-9: log-ratios are clamped to this before exponentiating.
SAFETY_BOUND = 20.0


def parse_is_threshold(threshold: str | float) -> tuple[float, float | None]:
    """(upper, lower) from `rollout_is_threshold`: a number gives TIS (lower None), "lower_upper" IcePop."""
    if isinstance(threshold, bool) or not isinstance(threshold, int | float | str):
        raise TypeError(f"rollout_is_threshold must be a number or a 'lower_upper' string, got {threshold!r}")
    spec = str(threshold).strip()
    parts = spec.split("_", 1) if "_" in spec else [spec]
    try:
        bounds = [float(part) for part in parts]
    except ValueError as exc:
        raise ValueError(f"invalid rollout_is_threshold {threshold!r}") from exc
    upper, lower = bounds[-1], (bounds[0] if len(bounds) == 2 else None)
    if upper <= 0 or (lower is not None and lower <= 0):
        raise ValueError(f"rollout_is_threshold bounds must be positive, got {threshold!r}")
    if lower is not None and lower > upper:
        raise ValueError(f"rollout_is_threshold lower bound must be ≤ upper bound, got {threshold!r}")
    return upper, lower


def token_log_weights(log_ratio: Tensor, response_mask: Tensor) -> tuple[Tensor, Tensor]:
    """log ρ_t per token: ([N, T] for the weights, [N, T] for the metrics)."""
    return log_ratio, log_ratio


def sequence_log_weights(log_ratio: Tensor, response_mask: Tensor) -> tuple[Tensor, Tensor]:
    """log ∏_t ρ_t = Σ_t m_t·log ρ_t, broadcast over the row: ([N, T], [N, 1] for the metrics)."""
    log_sum = masked_sum(log_ratio, response_mask, dim=-1).unsqueeze(-1)  # [N, 1]
    return log_sum.expand_as(log_ratio), log_sum


IS_LEVELS: dict[str, Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]] = {
    "token": token_log_weights,
    "sequence": sequence_log_weights,
}


@torch.no_grad()
def rollout_is_weights(
    log_ratio: Tensor,  # [N, T] log π_train − log π_rollout
    response_mask: Tensor,  # [N, T]
    *,
    level: str = "token",
    threshold: str | float = 2.0,
    batch_normalize: bool = False,
) -> tuple[Tensor, dict[str, float]]:
    """Detached IS weights [N, T] (0 outside the mask) and their `rollout_is_*` metrics.

    raw = exp(clamp(log ρ, ±20))·m; TIS: w = min(raw, upper); IcePop: w = raw if lower ≤ raw ≤ upper
    else 0. Metrics are taken before batch normalization; with `batch_normalize` the weights are
    divided by their batch mean (`normalize_is_weights`) and the factor is logged.
    """
    if level not in IS_LEVELS:
        raise ValueError(f"unknown rollout_is level {level!r}; valid levels: {sorted(IS_LEVELS)}")
    if log_ratio.shape != response_mask.shape:
        raise ValueError(
            f"log_ratio {tuple(log_ratio.shape)} must match response_mask {tuple(response_mask.shape)}"
        )
    upper, lower = parse_is_threshold(threshold)
    log_weights, log_ratio_for_metrics = IS_LEVELS[level](log_ratio, response_mask)
    valid = response_mask.bool()
    zero = torch.zeros((), dtype=log_weights.dtype, device=log_weights.device)
    raw = torch.where(valid, torch.exp(log_weights.clamp(-SAFETY_BOUND, SAFETY_BOUND)), zero)
    if lower is None:
        weights = raw.clamp(max=upper)
    else:
        weights = torch.where((raw >= lower) & (raw <= upper), raw, zero)
    metrics = is_weight_metrics(weights, raw, log_ratio_for_metrics, response_mask, level, upper, lower)
    if lower is not None:
        out_of_bounds = (raw < lower) | (raw > upper)
        metrics["rollout_is_oob_ratio"] = masked_mean(out_of_bounds.float(), response_mask).item()
    if batch_normalize:
        weights, factor = normalize_is_weights(weights, response_mask, level)
        metrics["rollout_is_batch_norm_factor"] = factor
    return weights, metrics


def is_weight_sum_and_count(weights: Tensor, response_mask: Tensor, level: str) -> tuple[Tensor, Tensor]:
    """The two local totals whose ratio is the batch mean: token weights, or one weight per sequence.

    For data parallelism the caller all-reduces both over ranks and passes them to
    `normalize_is_weights` (verl's `distributed_masked_mean`).
    """
    if level == "token":
        return masked_sum(weights, response_mask), response_mask.sum().to(weights.dtype)
    per_sequence = masked_mean(weights, response_mask, dim=-1)  # [N]
    non_empty = (response_mask.sum(dim=-1) > 0).to(weights.dtype)  # [N]
    return (per_sequence * non_empty).sum(), non_empty.sum()


def normalize_is_weights(
    weights: Tensor,
    response_mask: Tensor,
    level: str,
    *,
    total: Tensor | None = None,
    count: Tensor | None = None,
) -> tuple[Tensor, float]:
    """w / mean(w) over the batch, and the mean (1.0 and w unchanged when the mean is ≤ 1e-8).

    Without `total`/`count` the mean is local, with verl's local guards: Σw/(n + 1e-8) for tokens,
    Σw_seq / max(n_seq, 1e-8) for sequences.
    """
    if total is None or count is None:
        total, count = is_weight_sum_and_count(weights, response_mask, level)
        count = count + 1e-8 if level == "token" else count.clamp_min(1e-8)
    mean = total / count
    if mean > 1e-8:
        return weights / mean, mean.item()
    return weights, 1.0


def is_weight_metrics(
    weights: Tensor,  # [N, T] applied weights
    raw_weights: Tensor,  # [N, T] before truncation / IcePop
    log_ratio_for_metrics: Tensor,  # [N, T] token level, [N, 1] sequence level
    response_mask: Tensor,
    level: str,
    upper: float,
    lower: float | None,
) -> dict[str, float]:
    """verl's `rollout_is_*` statistics. lower defaults to 1/upper for the "low" fractions.

    As in verl, sequence-level max/min/fractions and all `rollout_is_seq_*` statistics take every row,
    including rows with an empty mask (weight 1 at sequence level, mean 0 for the `seq_*` means).
    """
    if not response_mask.any():
        raise ValueError("response_mask must contain at least one valid token")
    lower = 1.0 / upper if lower is None else lower
    valid = response_mask.bool()
    metrics: dict[str, float] = {"rollout_is_mean": masked_mean(weights, response_mask).item()}
    if level == "sequence":
        metrics["rollout_is_max"] = torch.exp(log_ratio_for_metrics.max().clamp(max=SAFETY_BOUND)).item()
        metrics["rollout_is_min"] = torch.exp(log_ratio_for_metrics.min()).item()
        metrics["rollout_is_ratio_fraction_high"] = (
            (log_ratio_for_metrics > math.log(upper)).float().mean().item()
        )
        metrics["rollout_is_ratio_fraction_low"] = (
            (log_ratio_for_metrics < math.log(lower)).float().mean().item()
        )
    else:
        metrics["rollout_is_ratio_fraction_high"] = masked_mean(
            (raw_weights > upper).float(), response_mask
        ).item()
        metrics["rollout_is_ratio_fraction_low"] = masked_mean(
            (raw_weights < lower).float(), response_mask
        ).item()
        metrics["rollout_is_max"] = weights.masked_fill(~valid, -math.inf).max().item()
        metrics["rollout_is_min"] = weights.masked_fill(~valid, math.inf).min().item()
    bounded = weights.clamp(min=0.0, max=upper)
    metrics["rollout_is_std"] = masked_moment_std(bounded, response_mask) if response_mask.sum() > 1 else 0.0
    normalized = bounded / (masked_mean(bounded, response_mask) + 1e-8)
    second_moment = masked_mean(normalized.square(), response_mask).item()
    # All weights 0 (IcePop rejected every token): no effective sample. verl divides by zero here.
    metrics["rollout_is_eff_sample_size"] = 1.0 / second_moment if second_moment > 0 else 0.0
    metrics.update(_sequence_weight_metrics(weights, raw_weights, response_mask, upper, lower))
    return metrics


def masked_moment_std(values: Tensor, mask: Tensor) -> float:
    """sqrt(max(E_m[x²] − E_m[x]², 0)): the population std over the mask from two moments (verl's form)."""
    variance = masked_mean(values.square(), mask) - masked_mean(values, mask).square()
    return torch.sqrt(variance.clamp(min=0.0)).item()


def _sequence_weight_metrics(
    weights: Tensor, raw_weights: Tensor, response_mask: Tensor, upper: float, lower: float
) -> dict[str, float]:
    """`rollout_is_seq_*`: statistics of each row's mean weight; the fractions use the raw weights."""
    per_sequence = masked_mean(weights, response_mask, dim=-1)  # [N]
    raw_per_sequence = masked_mean(raw_weights, response_mask, dim=-1)  # [N]
    return {
        "rollout_is_seq_mean": per_sequence.mean().item(),
        "rollout_is_seq_std": per_sequence.std().item() if per_sequence.numel() > 1 else 0.0,
        "rollout_is_seq_max": per_sequence.max().item(),
        "rollout_is_seq_min": per_sequence.min().item(),
        "rollout_is_seq_max_deviation": (per_sequence - 1.0).abs().max().item(),
        "rollout_is_seq_fraction_high": (raw_per_sequence > upper).float().mean().item(),
        "rollout_is_seq_fraction_low": (raw_per_sequence < lower).float().mean().item(),
    }
