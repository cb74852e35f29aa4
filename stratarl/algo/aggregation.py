"""Layer 6, RL math: loss aggregation, the step that turns a per-token loss [N, T] into one scalar.

Owns the registry `LOSS_AGGREGATIONS` (verl 0.9.1's `loss_agg_mode` names) and `aggregate_loss`.
Most length-bias bugs live here, so it is a visible step of its own rather than a hidden tail of
every loss (see docs/algorithms/losses.md).

Data parallelism: each rank aggregates its own rows and the optimizer averages gradients over the
D ranks. Every mode therefore multiplies by `dp_size` and divides by a count of the *global* batch
(tokens or sequences) passed in as an argument; the average over ranks then equals the loss of the
whole batch on one rank. With dp_size=1 and no global count, the count of this batch is used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from stratarl.algo.masked import masked_mean, masked_sum
from stratarl.algo.registry import look_up

Count = int | float | Tensor


def _divide_by_count(total: Tensor, count: Count) -> Tensor:
    """total / count, and 0 (still attached to the graph) when count is 0.

    Departure from verl 0.9.1, which returns 0/0 = NaN for an empty batch; a NaN loss poisons
    the gradient and makes verl skip the whole optimizer step.
    """
    count = torch.as_tensor(count, device=total.device)
    return total / torch.where(count == 0, torch.ones_like(count), count)


def _require_global(count: Count | None, dp_size: int, argument: str) -> None:
    """verl 0.9.1's guard: with several ranks the local count would give each rank its own scale."""
    if count is None and dp_size > 1:
        raise ValueError(f"{argument} (a count over the global batch) is required when dp_size > 1")


def _sequence_mask(response_mask: Tensor) -> Tensor:
    """[N] 1 for rows with at least one valid token; fully masked rows count in no seq-mean."""
    return (response_mask.sum(dim=-1) > 0).to(response_mask.dtype)


@dataclass(frozen=True)
class AggregationScale:
    """What every mode may scale by: D ranks, the counts of the global batch, the constant S.

    Each mode reads the fields it needs (token-mean the token count, the seq-mean modes the
    sequence count, seq-mean-token-sum-norm also S); `aggregate_loss` documents them.
    """

    dp_size: int = 1
    global_num_tokens: Count | None = None
    global_batch_size: Count | None = None
    loss_scale_factor: float | None = None


def token_mean(
    loss: Tensor,  # [N, T]
    mask: Tensor,  # [N, T]
    scale: AggregationScale,
) -> Tensor:
    """Σ_it ℓ_it·m_it / T_glob · D, T_glob = valid tokens of the global batch (default: Σ m here).

    Every token weighs the same, so a long response weighs more than a short one (DAPO's choice).
    """
    _require_global(scale.global_num_tokens, scale.dp_size, "global_num_tokens")
    num_tokens = mask.sum() if scale.global_num_tokens is None else scale.global_num_tokens
    return _divide_by_count(masked_sum(loss, mask), num_tokens) * scale.dp_size


def token_sum(loss: Tensor, mask: Tensor, scale: AggregationScale) -> Tensor:
    """Σ_it ℓ_it·m_it · D: the plain sum over the global batch once ranks average (new in 0.9.1)."""
    return masked_sum(loss, mask) * scale.dp_size


def _mean_over_sequences(
    seq_losses: Tensor,  # [N] one loss per response
    mask: Tensor,  # [N, T]
    scale: AggregationScale,
) -> Tensor:
    """Σ_i s_i / B · D over rows with a valid token; B = global rows (default: here)."""
    _require_global(scale.global_batch_size, scale.dp_size, "global_batch_size")
    seq_mask = _sequence_mask(mask)  # [N]
    num_seqs = seq_mask.sum() if scale.global_batch_size is None else scale.global_batch_size
    return _divide_by_count(masked_sum(seq_losses, seq_mask), num_seqs) * scale.dp_size


def seq_mean_token_sum(loss: Tensor, mask: Tensor, scale: AggregationScale) -> Tensor:
    """Σ_i (Σ_t ℓ_it·m_it) / B · D over rows with a valid token; B = global rows (default: here)."""
    return _mean_over_sequences(masked_sum(loss, mask, dim=-1), mask, scale)


def seq_mean_token_mean(loss: Tensor, mask: Tensor, scale: AggregationScale) -> Tensor:
    """Σ_i [Σ_t ℓ_it·m_it / (Σ_t m_it + 1e-8)] / B · D: every response weighs the same (GRPO's choice)."""
    return _mean_over_sequences(masked_mean(loss, mask, dim=-1), mask, scale)


def seq_mean_token_sum_norm(loss: Tensor, mask: Tensor, scale: AggregationScale) -> Tensor:
    """seq-mean-token-sum / S, S = `loss_scale_factor` or the padded width T of `mask` (Dr. GRPO,
    arXiv:2503.20783: a constant instead of each response's length).

    verl 0.9.1 semantics; up to 0.8 this was Σ_it ℓ_it·m_it / S with no seq-mean and no D, so
    new = old · D / B. The default S depends on padding: pass `loss_scale_factor` (e.g. the maximum
    response length) so that padding and the split over ranks change nothing.
    """
    seq_mean = seq_mean_token_sum(loss, mask, scale)
    return seq_mean / (mask.shape[-1] if scale.loss_scale_factor is None else scale.loss_scale_factor)


LossAggregation = Callable[[Tensor, Tensor, AggregationScale], Tensor]  # (loss, mask, scale)

LOSS_AGGREGATIONS: dict[str, LossAggregation] = {
    "token-mean": token_mean,
    "token-sum": token_sum,
    "seq-mean-token-sum": seq_mean_token_sum,
    "seq-mean-token-mean": seq_mean_token_mean,
    "seq-mean-token-sum-norm": seq_mean_token_sum_norm,
}


def get_loss_aggregation(name: str) -> LossAggregation:
    """The aggregation registered under `name`; ValueError naming the valid names otherwise."""
    return look_up(LOSS_AGGREGATIONS, name, "loss aggregation")


def aggregate_loss(
    per_token_loss: Tensor,  # [N, T]
    response_mask: Tensor,  # [N, T] 1 on tokens that count (bool, int or float)
    mode: str,
    *,
    dp_size: int = 1,
    global_num_tokens: Count | None = None,
    global_batch_size: Count | None = None,
    loss_scale_factor: float | None = None,
) -> Tensor:  # scalar
    """Aggregate a per-token loss with the mode named `mode` (verl's `agg_loss`).

    dp_size: data-parallel ranks D whose gradients are averaged. global_num_tokens: valid tokens of
    the global batch (verl's `batch_num_tokens`), needed by token-mean when D > 1.
    global_batch_size: sequences of the global batch, needed by the seq-mean modes when D > 1.
    loss_scale_factor: the constant S of seq-mean-token-sum-norm.

    Values outside the mask never reach the result, not even as NaN (verl's seq-mean modes let a
    NaN at a padded position through). An empty batch gives 0 where verl gives NaN.
    """
    if per_token_loss.dim() != 2:
        raise ValueError(f"per_token_loss must be [N, T], got shape {tuple(per_token_loss.shape)}")
    if response_mask.shape != per_token_loss.shape:
        raise ValueError(
            f"response_mask shape {tuple(response_mask.shape)} != per_token_loss shape "
            f"{tuple(per_token_loss.shape)}"
        )
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    aggregation = get_loss_aggregation(mode)
    mask = response_mask.to(per_token_loss.dtype)
    scale = AggregationScale(dp_size, global_num_tokens, global_batch_size, loss_scale_factor)
    return aggregation(per_token_loss, mask, scale)
