"""Layer 6, RL math: the on-policy distillation loss on the teacher's top-k tokens — forward
KL(π_T ‖ π_θ) restricted to the K tokens the teacher ranks highest at each position (verl 0.9.1's
`loss_mode` forward_kl_topk), with the mass and overlap diagnostics verl logs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def student_log_probs_at(logits: Tensor, token_ids: Tensor) -> Tensor:  # [N, T, V], [N, T, K] -> [N, T, K]
    """log softmax(z)_k at the given ids, computed in float32: z_k − logsumexp(z)."""
    logits = logits.float()
    return torch.gather(logits, -1, token_ids) - torch.logsumexp(logits, dim=-1, keepdim=True)


def forward_kl_top_k(
    *,
    student_top_k_log_probs: Tensor,  # [N, T, K] log π_θ(v) at the teacher's top-k ids v
    teacher_top_k_log_probs: Tensor,  # [N, T, K] log π_T(v) of the teacher's top-k ids
    log_prob_min_clamp: float | None = None,
) -> Tensor:  # [N, T]
    """ℓ_t = max(0, Σ_{v ∈ top-k_T(t)} π_T(v) (log π_T(v) − log π_θ(v))).

    Both log-probs are first clamped from below at log_prob_min_clamp (None: no clamp), so a token
    the student gives ~0 mass cannot blow the loss up. The sum runs over K < V tokens, so neither
    distribution sums to 1 and the truncated sum can fall below 0: it is clamped at 0, as in verl.
    Computed in float32.
    """
    student, teacher = student_top_k_log_probs.float(), teacher_top_k_log_probs.float()
    if student.shape != teacher.shape or student.dim() != 3:
        raise ValueError(
            f"top-k log-probs must be [N, T, K] alike, got {tuple(student.shape)} and {tuple(teacher.shape)}"
        )
    if log_prob_min_clamp is not None:
        student = student.clamp_min(log_prob_min_clamp)
        teacher = teacher.clamp_min(log_prob_min_clamp)
    return (teacher.exp() * (teacher - student)).sum(dim=-1).clamp_min(0.0)


@dataclass(frozen=True)
class TopKDiagnostics:
    """Per-token [N, T] diagnostics of the top-k loss (arXiv:2604.13016 for the overlap ones).

    student_mass Σ_k π_θ(v_k) and teacher_mass Σ_k π_T(v_k) over the teacher's top-k ids (before
    any clamp); overlap_count |top-k_T ∩ top-k_θ|; overlap_token_advantage the mean of
    −π_T(v)(log π_T(v) − log π_θ(v)) over the shared ids (0 where none is shared).
    """

    student_mass: Tensor
    teacher_mass: Tensor
    overlap_count: Tensor
    overlap_token_advantage: Tensor


def top_k_diagnostics(
    *,
    student_top_k_log_probs: Tensor,  # [N, T, K] at the teacher's ids, unclamped
    teacher_top_k_log_probs: Tensor,  # [N, T, K]
    teacher_top_k_ids: Tensor,  # [N, T, K]
    student_top_k_ids: Tensor,  # [N, T, K] the student's own K most likely ids
    log_prob_min_clamp: float | None = None,
) -> TopKDiagnostics:
    """The masses and the overlap of the two top-k sets; the advantage uses the clamped log-probs."""
    student, teacher = student_top_k_log_probs.float(), teacher_top_k_log_probs.float()
    student_mass, teacher_mass = student.exp().sum(-1), teacher.exp().sum(-1)
    if log_prob_min_clamp is not None:
        student, teacher = student.clamp_min(log_prob_min_clamp), teacher.clamp_min(log_prob_min_clamp)
    shared = (teacher_top_k_ids.unsqueeze(-1) == student_top_k_ids.unsqueeze(-2)).any(-1)  # [N, T, K]
    count = shared.sum(-1)  # [N, T]
    advantage = (-teacher.exp() * (teacher - student) * shared).sum(-1) / count.clamp_min(1)
    advantage = torch.where(count > 0, advantage, torch.zeros_like(advantage))
    return TopKDiagnostics(student_mass, teacher_mass, count, advantage)
