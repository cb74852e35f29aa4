"""Layer 5, training engine: the output head's top-k — the K most likely tokens at each scored
position, and log-probs at K given ids — without materializing [positions, V] logits at once.

For hidden states h [n, d] and the temperature-scaled logits z = cap(s·(h Wᵀ + b)) / τ (`fused_head`):

    log π(v) = z_v − logsumexp(z)
    top-k ids = argtop_K z,  their log-probs log π(v) at those ids         (no gradient: the teacher)
    log π(u_j) at given ids u [n, K]                                      (with gradient: the student)

On-policy distillation's forward_kl_topk needs the teacher's top-k ids and log-probs at every
response token (`head_top_k`), then the student's log-probs at those same ids inside its update
(`head_log_probs_at`). Both make `chunk_size` rows of logits at a time. The student's form keeps
only its [n, K] outputs for the backward and recomputes each chunk's logits there
(`torch.utils.checkpoint`), so the extra memory is O(chunk_size·V), not O(n·V).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from stratarl.engine.fused_head import IDENTITY, LOGIT_CHUNK_SIZE, LogitTransform, head_logits


def _log_softmax(hidden, weight, bias, temperature: float, transform: LogitTransform) -> Tensor:
    """[c, d] -> [c, V] fp32 log π."""
    return torch.log_softmax(head_logits(hidden, weight, bias, temperature, transform), dim=-1)


@torch.no_grad()
def head_top_k(
    hidden: Tensor,  # [n, d]
    weight: Tensor,  # [V, d]
    bias: Tensor | None,  # [V]
    k: int,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = LOGIT_CHUNK_SIZE,
    transform: LogitTransform = IDENTITY,
) -> tuple[Tensor, Tensor]:  # [n, K] int64 ids (most likely first), [n, K] fp32 log π
    """The K most likely tokens at each row and their log-probs, `chunk_size` rows at a time."""
    if not 1 <= k <= weight.shape[0]:
        raise ValueError(f"top-k needs 1 ≤ k ≤ V = {weight.shape[0]}, got k={k}")
    num = hidden.shape[0]
    ids = torch.empty(num, k, dtype=torch.long, device=hidden.device)
    log_probs = torch.empty(num, k, dtype=torch.float32, device=hidden.device)
    step = chunk_size or max(num, 1)
    for lo in range(0, num, step):
        top = torch.topk(
            _log_softmax(hidden[lo : lo + step], weight, bias, temperature, transform), k, dim=-1
        )
        log_probs[lo : lo + step], ids[lo : lo + step] = top.values, top.indices
    return ids, log_probs


def _chunk_log_probs_at(hidden, weight, bias, ids, temperature, transform) -> tuple[Tensor, Tensor]:
    """([c, K] log π at `ids`, [c, K] this chunk's own top-K ids)."""
    log_pi = _log_softmax(hidden, weight, bias, temperature, transform)
    return log_pi.gather(-1, ids), torch.topk(log_pi.detach(), ids.shape[-1], dim=-1).indices


def head_log_probs_at(
    hidden: Tensor,  # [n, d]
    weight: Tensor,  # [V, d]
    bias: Tensor | None,  # [V]
    ids: Tensor,  # [n, K] token ids to score at each row
    *,
    temperature: float = 1.0,
    chunk_size: int | None = LOGIT_CHUNK_SIZE,
    transform: LogitTransform = IDENTITY,
) -> tuple[Tensor, Tensor]:  # [n, K] fp32 log π(ids) with gradient, [n, K] own top-K ids (no gradient)
    """log π at the given ids (differentiable in h, W, b), and this model's own K most likely ids
    at each row (for the top-k overlap diagnostics). With a chunk size, each chunk's logits are
    recomputed in the backward instead of kept."""
    if ids.dim() != 2 or ids.shape[0] != hidden.shape[0]:
        raise ValueError(f"ids {tuple(ids.shape)} must be [{hidden.shape[0]}, K]")
    ids = ids.long()
    if chunk_size is None or hidden.shape[0] == 0:
        return _chunk_log_probs_at(hidden, weight, bias, ids, temperature, transform)
    parts = [
        checkpoint(
            _chunk_log_probs_at,
            hidden[lo : lo + chunk_size],
            weight,
            bias,
            ids[lo : lo + chunk_size],
            temperature,
            transform,
            use_reentrant=False,
        )
        for lo in range(0, hidden.shape[0], chunk_size)
    ]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
