"""Layer 5, training engine: log-prob and entropy of the output head without materializing [K, V].

For K scored positions with hidden states h [K, d], output weight W [V, d] (and bias b), temperature τ,
and the model's own logit transform (`LogitTransform`: a scale s, e.g. Cohere's `logit_scale`, and
Gemma's final soft-cap c, logits = c·tanh(l/c)):

    r = h Wᵀ + b                        the head's output, fp32, computed `chunk_size` rows at a time
    z = cap_c(s·r) / τ                  the model's logits divided by τ (cap_c = identity without c)
    log π(y) = z_y − logsumexp(z)       H = logsumexp(z) − Σ_v softmax(z)_v z_v

The forward keeps only h, W and the labels; the backward recomputes each chunk's logits and uses

    ∂log π(y)/∂z = onehot(y) − p        ∂H/∂z = p ⊙ (E_p[z] − z)
    ∂z/∂r = s·(1 − (zτ/c)²)/τ  (s/τ without a cap)        ∂r/∂h = W,  ∂r/∂W = hᵀ

so the extra memory is O(chunk_size·V) instead of O(K·V) for logits, softmax and their gradients
(verl's `use_fused_kernels`, `linear_cross_entropy`, is the GPU kernel of the same idea). Only the
K positions that score a response token go through the head: prompt positions never make logits.
`head_scores_naive` is the plain form, the reference for tests and benchmarks.

`head_sum_pi_squared` gives Σ_v π(v)² at each position (no gradient), the statistic the optimal-token-
baseline estimators weight paths with (`algo/advantages/optimal_token_baseline.py`), chunked the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from stratarl.algo.entropy import entropy_from_logits, log_prob_from_logits

# Rows of logits per chunk. At V = 32k, fp32, one chunk is 32 MiB; forward + backward of K = 2048
# tokens then peaks at +242 MiB against +1806 MiB for the plain form (docs/benchmarks.md, "Training engine").
LOGIT_CHUNK_SIZE = 256


@dataclass(frozen=True)
class LogitTransform:
    """What a model does to its head's output r before returning logits: cap_c(s·r)."""

    scale: float = 1.0
    softcap: float | None = None

    def apply(self, raw: Tensor) -> Tensor:
        logits = raw * self.scale if self.scale != 1.0 else raw
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def apply_(self, raw: Tensor) -> Tensor:
        """`apply` in place on `raw` (a buffer the caller owns), returned."""
        if self.scale != 1.0:
            raw.mul_(self.scale)
        if self.softcap is not None:
            raw.div_(self.softcap).tanh_().mul_(self.softcap)
        return raw

    def grad_factor(self, z: Tensor, temperature: float) -> Tensor | float:
        """∂z/∂r at the logits z = cap_c(s·r)/τ (one number without a cap)."""
        if self.softcap is None:
            return self.scale / temperature
        t = z * (temperature / self.softcap)  # tanh(s·r/c)
        return (1.0 - t * t) * (self.scale / temperature)


IDENTITY = LogitTransform()


def head_logits(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, temperature: float, transform: LogitTransform
) -> Tensor:
    """[c, d] -> [c, V] in fp32 (the matmul in the weights' dtype, like the model's own head)."""
    return transform.apply(F.linear(hidden.to(weight.dtype), weight, bias).float()) / temperature


def _logits_into(
    out: Tensor,
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    temperature: float,
    transform: LogitTransform,
) -> Tensor:
    """`head_logits` written into `out` [c, V] fp32, a buffer reused by every chunk: a fresh [c, V] tensor per
    chunk and per elementwise step costs more than the arithmetic once c·V·4 bytes pass the allocator's
    cache (glibc maps blocks over 32 MiB anew, so each one is page-faulted in: 48 MiB at V = 49k)."""
    h = hidden.to(weight.dtype)
    if weight.dtype != torch.float32:
        out.copy_(F.linear(h, weight, bias))  # the head's own dtype, then fp32
    elif bias is None:
        torch.mm(h, weight.T, out=out)
    else:
        torch.addmm(bias, h, weight.T, out=out)
    transform.apply_(out)
    return out.div_(temperature) if temperature != 1.0 else out


class _HeadScores(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature, chunk_size, with_entropy, transform):
        num, rows = hidden.shape[0], min(chunk_size, hidden.shape[0])
        log_prob = hidden.new_empty(num, dtype=torch.float32)
        entropy = hidden.new_empty(num if with_entropy else 0, dtype=torch.float32)
        z_buf = hidden.new_empty(rows, weight.shape[0], dtype=torch.float32)  # [c, V], every chunk
        e_buf = torch.empty_like(z_buf)
        for lo in range(0, num, chunk_size):
            hi = min(lo + chunk_size, num)
            z = _logits_into(z_buf[: hi - lo], hidden[lo:hi], weight, bias, temperature, transform)
            # shifted by m = max z, e = exp(z − m), S = Σ e:  log π(y) = (z_y − m) − log S,
            # H = log S − E_π[z − m] = log S − Σ e·(z − m) / S
            shifted = z.sub_(z.amax(dim=-1, keepdim=True))
            e = torch.exp(shifted, out=e_buf[: hi - lo])
            total = e.sum(dim=-1)
            log_total = total.log()
            log_prob[lo:hi] = shifted.gather(-1, labels[lo:hi, None]).squeeze(-1) - log_total
            if with_entropy:
                entropy[lo:hi] = log_total - e.mul_(shifted).sum(dim=-1) / total
        ctx.save_for_backward(hidden, weight, bias, labels)
        ctx.set_materialize_grads(False)  # an unused output (entropy outside the loss) gets None, no work
        ctx.settings = (temperature, chunk_size, with_entropy, transform)
        return log_prob, entropy

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_log_prob, grad_entropy):
        hidden, weight, bias, labels = ctx.saved_tensors
        temperature, chunk_size, with_entropy, transform = ctx.settings
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        with_entropy = with_entropy and grad_entropy is not None
        num, rows = hidden.shape[0], min(chunk_size, hidden.shape[0])
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = None  # fp32 [V, d]: the first chunk's product, then accumulated in place
        grad_b = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_b else None
        z_buf = hidden.new_empty(rows, weight.shape[0], dtype=torch.float32)  # [c, V], every chunk
        p_buf = torch.empty_like(z_buf)
        for lo in range(0, num, chunk_size):
            hi = min(lo + chunk_size, num)
            z = _logits_into(z_buf[: hi - lo], hidden[lo:hi], weight, bias, temperature, transform)
            factor = transform.grad_factor(z, temperature)  # ∂z/∂r, read before z is overwritten
            p = torch.softmax(z, dim=-1, out=p_buf[: hi - lo])
            if with_entropy:  # z becomes p ⊙ (E_p[z] − z) · ∂L/∂H
                expected_z = (p * z).sum(dim=-1, keepdim=True)
                entropy_term = z.neg_().add_(expected_z).mul_(p).mul_(grad_entropy[lo:hi, None])
            if grad_log_prob is None:  # only the entropy is in the loss
                grad_z = entropy_term if with_entropy else p.zero_()
            else:  # p becomes (onehot(y) − p) · ∂L/∂log π (+ the entropy term)
                g_lp = grad_log_prob[lo:hi, None]  # [c, 1]
                grad_z = p.mul_(-g_lp).scatter_add_(-1, labels[lo:hi, None], g_lp)
                if with_entropy:
                    grad_z += entropy_term
            grad_z *= factor  # now ∂/∂r, r = h Wᵀ + b
            if need_h:
                grad_h[lo:hi] = (grad_z.to(weight.dtype) @ weight).to(hidden.dtype)
            if need_w and grad_w is None:
                grad_w = grad_z.T @ hidden[lo:hi].float()
            elif need_w:
                grad_w.addmm_(grad_z.T, hidden[lo:hi].float())
            if need_b:
                grad_b += grad_z.sum(dim=0)
        if need_w and grad_w is None:  # no rows
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        grad_w = grad_w.to(weight.dtype) if need_w else None
        grad_b = grad_b.to(bias.dtype) if need_b else None
        return grad_h, grad_w, grad_b, None, None, None, None, None


def head_scores(
    hidden: Tensor,  # [K, d]
    weight: Tensor,  # [V, d]
    bias: Tensor | None,  # [V]
    labels: Tensor,  # [K]
    *,
    temperature: float = 1.0,
    chunk_size: int = LOGIT_CHUNK_SIZE,
    with_entropy: bool = False,
    transform: LogitTransform = IDENTITY,
) -> tuple[Tensor, Tensor | None]:  # [K] log π(y), [K] H (fp32)
    """log π(label) (and entropy) at each row of `hidden`, `chunk_size` rows of logits at a time."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for scoring, got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if labels.shape != hidden.shape[:1]:
        raise ValueError(f"labels {tuple(labels.shape)} must be [{hidden.shape[0]}]")
    log_prob, entropy = _HeadScores.apply(
        hidden, weight, bias, labels, temperature, chunk_size, with_entropy, transform
    )
    return log_prob, entropy if with_entropy else None


def head_scores_naive(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    labels: Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    transform: LogitTransform = IDENTITY,
) -> tuple[Tensor, Tensor | None]:
    """The same quantities with all [K, V] logits in fp32 at once, autograd through every step."""
    logits = head_logits(hidden, weight, bias, temperature, transform)  # [K, V]
    entropy = entropy_from_logits(logits) if with_entropy else None
    return log_prob_from_logits(logits, labels), entropy


@torch.no_grad()
def head_sum_pi_squared(
    hidden: Tensor,  # [K, d]
    weight: Tensor,  # [V, d]
    bias: Tensor | None,  # [V]
    *,
    temperature: float = 1.0,
    chunk_size: int | None = LOGIT_CHUNK_SIZE,
    transform: LogitTransform = IDENTITY,
) -> Tensor:  # [K] Σ_v π(v)², fp32, in (0, 1]
    """Σ_v softmax(z)_v² of the temperature-scaled logits z, `chunk_size` rows at a time (None: all)."""
    num = hidden.shape[0]
    out = hidden.new_empty(num, dtype=torch.float32)
    step = chunk_size or max(num, 1)
    for lo in range(0, num, step):
        z = head_logits(hidden[lo : lo + step], weight, bias, temperature, transform)
        p = torch.softmax(z, dim=-1)  # [c, V]
        out[lo : lo + step] = (p * p).sum(dim=-1)
    return out
