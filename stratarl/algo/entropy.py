"""Layer 6, RL math: per-token entropy and log-probability of the sampled token, from logits [..., V].

Plain forms read like the formulas; the chunked forms give the same values and gradients while
their extra memory stays O(chunk·V) instead of O(N·T·V), with autograd or without. Engines pass
temperature-scaled logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

DEFAULT_CHUNK_SIZE = 2048  # rows (tokens) per chunk, verl's default


def entropy_from_logits(logits: Tensor) -> Tensor:
    """H(softmax z) = logsumexp(z) − Σ_v softmax(z)_v·z_v: [..., V] -> [...], in the dtype of `logits`."""
    probs = F.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def log_prob_from_logits(logits: Tensor, labels: Tensor) -> Tensor:
    """log softmax(z)[y] in at least fp32: [..., V], [...] -> [...]."""
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"labels {tuple(labels.shape)} must be logits.shape[:-1] = {tuple(logits.shape[:-1])}"
        )
    log_probs = F.log_softmax(_upcast(logits), dim=-1)
    return log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits_chunked(logits: Tensor, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Tensor:
    """entropy_from_logits computed `chunk_size` rows at a time, in at least fp32 (verl's chunking).

    Differs from verl's `entropy_from_logits_with_chunking` under autograd: verl's loop keeps every
    chunk's softmax for backward (O(N·T·V) again); here a custom backward recomputes each chunk's
    softmax, dH/dz = p ⊙ (E_p[z] − z), so only the logits themselves are kept.
    """
    rows = _as_rows(logits)
    return _ChunkedEntropy.apply(rows, _check_chunk(chunk_size)).reshape(logits.shape[:-1])


def log_prob_from_logits_chunked(
    logits: Tensor, labels: Tensor, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> Tensor:
    """log_prob_from_logits computed `chunk_size` rows at a time; backward d/dz = g·(onehot(y) − p)."""
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"labels {tuple(labels.shape)} must be logits.shape[:-1] = {tuple(logits.shape[:-1])}"
        )
    rows = _as_rows(logits)
    out = _ChunkedLogProb.apply(rows, labels.reshape(-1), _check_chunk(chunk_size))
    return out.reshape(labels.shape)


def _upcast(x: Tensor) -> Tensor:
    """x in fp32, or unchanged when it is already fp32/fp64 (verl computes chunks in fp32)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _as_rows(logits: Tensor) -> Tensor:
    """[..., V] -> [R, V] (a view when `logits` is contiguous)."""
    return logits.reshape(-1, logits.shape[-1])


def _check_chunk(chunk_size: int) -> int:
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be ≥ 1, got {chunk_size}")
    return chunk_size


def _chunk_starts(num_rows: int, chunk_size: int) -> range:
    return range(0, num_rows, chunk_size)


class _ChunkedEntropy(torch.autograd.Function):
    """Forward: H per row, chunk by chunk. Backward: recompute p per chunk; only `rows` is saved."""

    @staticmethod
    def forward(ctx, rows: Tensor, chunk_size: int) -> Tensor:  # [R, V] -> [R]
        out = rows.new_empty(rows.shape[0], dtype=torch.promote_types(rows.dtype, torch.float32))
        for start in _chunk_starts(rows.shape[0], chunk_size):
            z = _upcast(rows[start : start + chunk_size])
            out[start : start + chunk_size] = entropy_from_logits(z)
        ctx.save_for_backward(rows)
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, None]:
        (rows,) = ctx.saved_tensors
        grad = torch.empty_like(rows)
        for start in _chunk_starts(rows.shape[0], ctx.chunk_size):
            stop = start + ctx.chunk_size
            z = _upcast(rows[start:stop])
            probs = F.softmax(z, dim=-1)
            mean_z = (probs * z).sum(dim=-1, keepdim=True)  # E_p[z]
            grad[start:stop] = probs * (mean_z - z) * grad_out[start:stop].unsqueeze(-1)
        return grad, None


class _ChunkedLogProb(torch.autograd.Function):
    """Forward: z_y − logsumexp(z) per row, chunk by chunk. Backward: g·(onehot(y) − p) per chunk."""

    @staticmethod
    def forward(ctx, rows: Tensor, labels: Tensor, chunk_size: int) -> Tensor:  # [R, V], [R] -> [R]
        out = rows.new_empty(rows.shape[0], dtype=torch.promote_types(rows.dtype, torch.float32))
        for start in _chunk_starts(rows.shape[0], chunk_size):
            stop = start + chunk_size
            z = _upcast(rows[start:stop])
            picked = z.gather(-1, labels[start:stop].unsqueeze(-1)).squeeze(-1)
            out[start:stop] = picked - torch.logsumexp(z, dim=-1)
        ctx.save_for_backward(rows, labels)
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, None, None]:
        rows, labels = ctx.saved_tensors
        grad = torch.empty_like(rows)
        for start in _chunk_starts(rows.shape[0], ctx.chunk_size):
            stop = start + ctx.chunk_size
            g = grad_out[start:stop].unsqueeze(-1)  # [c, 1]
            chunk_grad = -F.softmax(_upcast(rows[start:stop]), dim=-1) * g
            chunk_grad.scatter_add_(-1, labels[start:stop].unsqueeze(-1), g.to(chunk_grad.dtype))
            grad[start:stop] = chunk_grad
        return grad, None, None
