"""Layer 6, RL math: reductions under a mask, the statistics every estimator and loss is built from.

A mask is 1 on tokens that count (action tokens of a response) and 0 elsewhere (observations,
padding). Values under a 0 mask never reach a result, not even as NaN.
"""

from __future__ import annotations

import torch
from torch import Tensor

# Added to a mask count before dividing, so that an all-masked reduction gives 0 instead of NaN
# (verl's value; it also enters every masked mean, so results match verl's to the last bit).
MASK_COUNT_EPS = 1e-8


def masked_sum(values: Tensor, mask: Tensor, dim: int | tuple[int, ...] | None = None) -> Tensor:
    """Σ values·mask over `dim` (all elements when None). NaN/inf outside the mask are ignored."""
    kept = torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))
    return (kept * mask).sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | tuple[int, ...] | None = None) -> Tensor:
    """Σ values·mask / (Σ mask + 1e-8). An all-masked reduction is 0."""
    return masked_sum(values, mask, dim) / (mask.sum(dim=dim) + MASK_COUNT_EPS)


def masked_var(values: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of the masked elements (a scalar over the whole tensor).

    unbiased=True applies Bessel's correction m/(m-1), m = Σ mask; it needs at least two masked
    elements and raises otherwise, because the estimate would be a division by zero.
    """
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        count = mask.sum()
        if count < 2:
            raise ValueError(
                f"masked_var(unbiased=True) needs at least 2 unmasked elements, got {int(count.item())}; "
                "use a larger batch or unbiased=False"
            )
        variance = variance * count / (count - 1)
    return variance


def masked_whiten(values: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    """(x − μ) / sqrt(σ² + 1e-8) with μ, σ² (unbiased) over the masked elements of the whole tensor.

    shift_mean=False adds μ back after scaling. Positions outside the mask are transformed too;
    callers multiply by the mask when those must be 0.
    """
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    return whitened if shift_mean else whitened + mean


def response_mask_from_eos(responses: Tensor, eos_token_ids: int | list[int]) -> Tensor:
    """[N, T] int64 mask that is 1 up to and including the first EOS of each row, 0 after it."""
    is_eos = torch.isin(responses, torch.as_tensor(eos_token_ids, device=responses.device)).long()
    return (is_eos.cumsum(dim=1) - is_eos).eq(0).long()
