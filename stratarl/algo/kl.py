"""Layer 6, RL math: per-token estimators of KL(π ‖ π_ref) from the log-probs of the sampled tokens.

Owns the registry `KL_ESTIMATORS` (verl's `kl_penalty` names) and `kl_penalty`, used by the
in-reward KL penalty (`kl_control.apply_kl_penalty`) and by the actor's KL loss.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from stratarl.algo.registry import look_up

KLEstimator = Callable[[Tensor, Tensor], Tensor]

# verl's numerical guards for k3: the exponent −Δ is clamped to ±20, the result to ±10.
K3_LOG_RATIO_BOUND = 20.0
K3_VALUE_BOUND = 10.0

STRAIGHT_THROUGH_SUFFIX = "+"


def kl_k1(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """k1 = Δ = log π − log π_ref. Unbiased for KL(π‖π_ref) under samples of π, but signed and noisy."""
    return log_prob - ref_log_prob


def kl_abs(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """|Δ|: non-negative, biased."""
    return (log_prob - ref_log_prob).abs()


def kl_k2(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """k2 = ½Δ². Biased as a value, but ∇k2 = Δ·∇log π is an unbiased KL gradient (arXiv:2505.17508)."""
    return 0.5 * (log_prob - ref_log_prob).square()


def kl_k3(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """k3 = exp(−Δ) + Δ − 1 (Schulman, "Approximating KL divergence", 2020): unbiased, ≥ 0, low variance.

    As in verl, −Δ is clamped to [−20, 20] before the exponential and the result to [−10, 10]; the
    clamps also stop the gradient where they bind.
    """
    neg_delta = (ref_log_prob - log_prob).clamp(-K3_LOG_RATIO_BOUND, K3_LOG_RATIO_BOUND)
    value = torch.exp(neg_delta) - neg_delta - 1.0
    return value.clamp(-K3_VALUE_BOUND, K3_VALUE_BOUND)


def straight_through(base: KLEstimator) -> KLEstimator:
    """Forward value of `base`, gradient of k2 (arXiv:2505.17508): k2 − sg(k2) + sg(base).

    verl spells this with a trailing '+' (`k3+`, `low_var_kl+`, ...). `k2+` equals k2.
    """

    def estimator(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
        k2 = kl_k2(log_prob, ref_log_prob)
        return k2 - k2.detach() + base(log_prob, ref_log_prob).detach()

    estimator.__name__ = f"{base.__name__}_straight_through"
    estimator.__doc__ = f"Value of {base.__name__}, gradient of k2 (straight-through)."
    return estimator


_BASE_ESTIMATORS: dict[str, KLEstimator] = {
    "k1": kl_k1,
    "kl": kl_k1,
    "abs": kl_abs,
    "k2": kl_k2,
    "mse": kl_k2,
    "k3": kl_k3,
    "low_var_kl": kl_k3,
}

KL_ESTIMATORS: dict[str, KLEstimator] = {
    **_BASE_ESTIMATORS,
    **{name + STRAIGHT_THROUGH_SUFFIX: straight_through(fn) for name, fn in _BASE_ESTIMATORS.items()},
}


def get_kl_estimator(name: str) -> KLEstimator:
    """The estimator registered under `name`; ValueError naming the valid names otherwise.

    "full" (the exact KL over the vocabulary) needs the full [N, T, V] distributions, which these
    per-token estimators never see; verl raises NotImplementedError for it, and so do we.
    """
    if name in KL_ESTIMATORS:
        return KL_ESTIMATORS[name]
    if name.rstrip(STRAIGHT_THROUGH_SUFFIX) == "full":
        raise NotImplementedError(
            "kl 'full' needs the full [N, T, V] distributions of both policies and is not implemented; "
            f"use one of the per-token estimators {sorted(KL_ESTIMATORS)}"
        )
    return look_up(KL_ESTIMATORS, name, "KL estimator")


def kl_penalty(log_prob: Tensor, ref_log_prob: Tensor, kind: str) -> Tensor:
    """Per-token KL estimate [N, T] (any shape; both inputs alike) with the estimator named `kind`.

    Positions outside the response mask are computed too; callers mask or aggregate.
    """
    if log_prob.shape != ref_log_prob.shape:
        raise ValueError(
            f"log_prob {tuple(log_prob.shape)} and ref_log_prob {tuple(ref_log_prob.shape)} must match"
        )
    return get_kl_estimator(kind)(log_prob, ref_log_prob)
