"""Layer 6, RL math: on-policy distillation losses on the sampled token alone — single-sample
estimators of the reverse KL(π_θ ‖ π_teacher) from the student's and the teacher's log-probs of the
token the student drew (verl 0.9.1's `loss_mode` k1/kl, abs, k2/mse, k3/low_var_kl).

Each is the KL estimator of the same name (`stratarl.algo.kl`) with the teacher in the reference's
place; the student samples, so E_{y~π_θ}[k1] = KL(π_θ ‖ π_teacher) per token.
"""

from __future__ import annotations

from torch import Tensor

from stratarl.algo.kl import kl_abs, kl_k1, kl_k2, kl_k3


def reverse_kl_k1(*, log_prob: Tensor, teacher_log_prob: Tensor) -> Tensor:  # [N, T] x2 -> [N, T]
    """k1 = log π_θ(y_t) − log π_T(y_t): unbiased for KL(π_θ ‖ π_T), signed.

    Its gradient, ∇log π_θ(y_t), does not depend on the teacher, so it only teaches as a reward
    (the policy-gradient form, use_policy_gradient=True); backpropagated directly it is refused.
    """
    return kl_k1(log_prob, teacher_log_prob)


def reverse_kl_abs(*, log_prob: Tensor, teacher_log_prob: Tensor) -> Tensor:  # [N, T] x2 -> [N, T]
    """|log π_θ(y_t) − log π_T(y_t)|: non-negative, biased."""
    return kl_abs(log_prob, teacher_log_prob)


def reverse_kl_k2(*, log_prob: Tensor, teacher_log_prob: Tensor) -> Tensor:  # [N, T] x2 -> [N, T]
    """k2 = ½ (log π_θ(y_t) − log π_T(y_t))²: biased as a value; its gradient Δ·∇log π_θ is the
    unbiased gradient of the reverse KL."""
    return kl_k2(log_prob, teacher_log_prob)


def reverse_kl_k3(*, log_prob: Tensor, teacher_log_prob: Tensor) -> Tensor:  # [N, T] x2 -> [N, T]
    """k3 = exp(−Δ) + Δ − 1 with Δ = log π_θ(y_t) − log π_T(y_t): unbiased, ≥ 0, low variance.

    verl's clamps of k3 apply (−Δ to ±20 before the exponential, the value to ±10).
    """
    return kl_k3(log_prob, teacher_log_prob)
