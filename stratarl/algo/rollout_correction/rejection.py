"""Layer 6, RL math: rejection sampling, a hard trust region that masks tokens or whole sequences whose
divergence between π_train and π_rollout leaves a bound (verl's `compute_rollout_rejection_mask`).

An option is `<level>_<estimator>`: level ∈ token, seq_sum, seq_mean, seq_max; estimator, on the
clamped log ratio log r = log π_train − log π_rollout,
    k1 = −log r,   k2 = ½(log r)²,   k3 = exp(log r) − 1 − log r.
k1 options keep lower ≤ exp(stat) ≤ upper (compared in log space; "lower_upper", or one number u
meaning [1/u, u]); k2/k3 options keep stat ≤ upper. Several options combine with AND.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from stratarl.algo.masked import masked_mean, masked_sum
from stratarl.algo.rollout_correction.is_weights import SAFETY_BOUND
from stratarl.algo.rollout_correction.rs_metrics import rejection_option_metrics

DIVERGENCES: dict[str, Callable[[Tensor], Tensor]] = {
    "k1": lambda log_ratio: -log_ratio,
    "k2": lambda log_ratio: 0.5 * log_ratio.square(),
    "k3": lambda log_ratio: torch.exp(log_ratio) - 1.0 - log_ratio,
}


def _sequence_max(values: Tensor, response_mask: Tensor) -> Tensor:
    """max over the row's valid tokens, 0 for an empty row: [N, T] -> [N]."""
    masked = values.masked_fill(~response_mask.bool(), -math.inf)
    row_max = masked.max(dim=-1).values
    return torch.where(row_max == -math.inf, torch.zeros_like(row_max), row_max)


# Sequence reductions [N, T] -> [N]; "token" keeps the per-token statistic.
SEQUENCE_REDUCTIONS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "seq_sum": lambda values, mask: masked_sum(values, mask, dim=-1),
    "seq_mean": lambda values, mask: masked_mean(values, mask, dim=-1),
    "seq_max": _sequence_max,
}

RS_OPTIONS: tuple[str, ...] = (
    *(f"token_{k}" for k in DIVERGENCES),
    *(f"{level}_{k}" for level in ("seq_sum", "seq_mean") for k in DIVERGENCES),
    "seq_max_k2",
    "seq_max_k3",
)


def parse_rs_options(rollout_rs: str) -> list[str]:
    """Comma-separated options, stripped, duplicates dropped in order; ValueError for unknown ones."""
    if not isinstance(rollout_rs, str):
        raise ValueError(f"rollout_rs must be a comma-separated string, got {rollout_rs!r}")
    options: list[str] = []
    for option in (part.strip() for part in rollout_rs.split(",")):
        if option and option not in RS_OPTIONS:
            raise ValueError(f"unknown rollout_rs option {option!r}; valid options: {sorted(RS_OPTIONS)}")
        if option and option not in options:
            options.append(option)
    if not options:
        raise ValueError("rollout_rs must name at least one option")
    return options


def parse_rs_thresholds(
    options: list[str], threshold: str | float | None
) -> dict[str, tuple[float | None, float]]:
    """{option: (lower, upper)} from one threshold per option or one broadcast to all (verl's rules).

    k1: "lower_upper" or a single upper u (lower = 1/u). k2/k3: a single positive upper (lower None).
    """
    if threshold is None:
        raise ValueError("rollout_rs_threshold must be given when rollout_rs is set")
    if isinstance(threshold, bool) or not isinstance(threshold, int | float | str):
        raise TypeError(f"rollout_rs_threshold must be a number or a string, got {threshold!r}")
    specs = (
        [threshold]
        if not isinstance(threshold, str)
        else [p.strip() for p in threshold.split(",") if p.strip()]
    )
    if len(specs) not in (1, len(options)):
        raise ValueError(
            f"rollout_rs_threshold needs 1 value or one per option "
            f"({len(options)} for {options}), got {specs}"
        )
    specs = specs * len(options) if len(specs) == 1 else specs
    return {
        option: _parse_one_threshold(option, str(spec)) for option, spec in zip(options, specs, strict=True)
    }


def _parse_one_threshold(option: str, spec: str) -> tuple[float | None, float]:
    is_k1 = option.endswith("k1")
    if "_" in spec and not is_k1:
        raise ValueError(f"rollout_rs_threshold for {option!r} takes one upper bound, got {spec!r}")
    try:
        bounds = [float(part) for part in spec.split("_", 1)]
    except ValueError as exc:
        raise ValueError(f"invalid rollout_rs_threshold {spec!r} for option {option!r}") from exc
    upper = bounds[-1]
    lower = (bounds[0] if len(bounds) == 2 else 1.0 / upper) if is_k1 else None
    if upper <= 0 or (lower is not None and lower <= 0):
        raise ValueError(f"rollout_rs_threshold for {option!r} must be positive, got {spec!r}")
    if lower is not None and lower > upper:
        raise ValueError(f"rollout_rs_threshold for {option!r} must have lower ≤ upper, got {spec!r}")
    return lower, upper


@torch.no_grad()
def rejection_mask(
    log_ratio: Tensor,  # [N, T] log π_train − log π_rollout
    response_mask: Tensor,  # [N, T]
    rollout_rs: str = "token_k1",
    rollout_rs_threshold: str | float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The response mask with rejected tokens set to 0 (same dtype), and `rollout_rs_*` metrics."""
    if log_ratio.shape != response_mask.shape:
        raise ValueError(
            f"log_ratio {tuple(log_ratio.shape)} must match response_mask {tuple(response_mask.shape)}"
        )
    options = parse_rs_options(rollout_rs)
    thresholds = parse_rs_thresholds(options, rollout_rs_threshold)
    if log_ratio.shape[0] == 0:
        return response_mask, {}
    safe_log_ratio = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    valid = response_mask.bool()
    keep_all = torch.ones_like(log_ratio)
    metrics: dict[str, float] = {}
    for option in options:
        keep, option_metrics = _apply_option(option, thresholds[option], safe_log_ratio, response_mask)
        keep_all = keep_all * keep.to(log_ratio.dtype)
        metrics.update(option_metrics)
    metrics["rollout_rs_masked_fraction"] = masked_mean(1.0 - keep_all, response_mask).item()
    # Over every row (an empty row counts as not rejected), unlike the per-option seq fraction.
    rejected_in_row = (~(keep_all > 0.5) & valid).any(dim=-1)
    metrics["rollout_rs_seq_masked_fraction"] = rejected_in_row.float().mean().item()
    return (response_mask * keep_all).to(response_mask.dtype), metrics


def _apply_option(
    option: str, bounds: tuple[float | None, float], safe_log_ratio: Tensor, response_mask: Tensor
) -> tuple[Tensor, dict[str, float]]:
    """([N, T] bool keep, metrics) for one option."""
    level, estimator = option.rsplit("_", 1)
    token_stat = DIVERGENCES[estimator](safe_log_ratio)  # [N, T]
    lower, upper = bounds
    # k1 bounds are ratios, compared with the statistic in log space.
    low, high = (math.log(lower), math.log(upper)) if lower is not None else (None, upper)
    if level == "token":
        stat, sequence_stat = token_stat, None
    else:
        sequence_stat = SEQUENCE_REDUCTIONS[level](token_stat, response_mask)  # [N]
        stat = sequence_stat.unsqueeze(-1).expand_as(token_stat)
    keep = stat <= high if low is None else (stat >= low) & (stat <= high)
    metrics = rejection_option_metrics(
        option, stat, response_mask, keep, sequence_stat=sequence_stat, upper=high, lower=low
    )
    return keep, metrics
