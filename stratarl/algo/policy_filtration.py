"""Layer 6, RL math: PF-PPO's policy filtration — which trajectories a step trains on, drawn with
replacement by weights of their scores (verl 0.9.1's `compute_pf_ppo_reweight_data`).

Shen & Zhang, "Policy Filtration in RLHF to Fine-Tune LLM for Code Generation", arXiv:2409.06957.
Owns the registry `PF_PPO_WEIGHTS` (verl's `algorithm.pf_ppo.reweight_method` names).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from stratarl.algo.registry import look_up

WEIGHT_FLOOR = 1e-8  # added to every weight, so that a row of weight 0 can still be drawn (verl's)
MAX_WEIGHT, OTHER_WEIGHT = 0.4, 0.1  # max_random: verl's constants


def pow_weights(*, scores: Tensor, weight_pow: float) -> Tensor:  # [N] -> [N]
    """w_i = |R_i|^p: larger rewards of either sign are trusted more (p = weight_pow)."""
    return torch.pow(torch.abs(scores), weight_pow)


def max_min_weights(*, scores: Tensor, weight_pow: float) -> Tensor:  # [N] -> [N]
    """w_i = 1 where R_i is the batch's max or min, else 0: only the extremes are drawn.
    weight_pow is not used (verl passes it to every method)."""
    is_extreme = (scores == scores.max()) | (scores == scores.min())
    return torch.where(is_extreme, 1.0, 0.0)


def max_random_weights(*, scores: Tensor, weight_pow: float) -> Tensor:  # [N] -> [N]
    """w_i = 0.4 where R_i is the batch's max, else 0.1: the best rows, and a random share of the rest.
    weight_pow is not used."""
    return torch.where(scores == scores.max(), MAX_WEIGHT, OTHER_WEIGHT)


PF_PPO_WEIGHTS: dict[str, Callable[..., Tensor]] = {
    "pow": pow_weights,
    "max_min": max_min_weights,
    "max_random": max_random_weights,
}


def pf_ppo_weights(*, scores: Tensor, reweight_method: str = "pow", weight_pow: float = 2.0) -> Tensor:
    """[N] sampling weights w̃_i = max(w_i + 1e-8, 1e-8) of the method's w_i (unnormalised).

    scores: [N] one scalar per trajectory (the trainer passes Σ_t token_level_scores, before any
    in-reward KL, as verl does). The max and min are over the whole batch, not per prompt group.
    """
    _check_scores(scores)
    weights = look_up(PF_PPO_WEIGHTS, reweight_method, "PF-PPO reweight method")(
        scores=scores, weight_pow=weight_pow
    )
    if not torch.isfinite(weights).all():
        raise ValueError(f"PF-PPO {reweight_method} weights are not finite (weight_pow={weight_pow})")
    return torch.clamp(weights + WEIGHT_FLOOR, min=WEIGHT_FLOOR)


def pf_ppo_resample(
    *,
    scores: Tensor,  # [N] one scalar per trajectory
    reweight_method: str = "pow",
    weight_pow: float = 2.0,
    generator: torch.Generator | None = None,
) -> Tensor:  # [N] int64 row indices, with repeats
    """PF-PPO: N rows drawn with replacement, row i with probability w̃_i / Σ_j w̃_j.

        w_i = |R_i|^p                               (pow)
        w_i = 1[R_i = max R  or  R_i = min R]       (max_min)
        w_i = 0.4 if R_i = max R else 0.1           (max_random)
        w̃_i = max(w_i + 1e-8, 1e-8);   i_1, …, i_N ~ Categorical(w̃ / Σ w̃)   (i.i.d.)

    The batch keeps its size N; the caller takes these rows from the batch (advantages included,
    as they were computed on the whole batch). All-equal scores give uniform draws in every method.

    generator: the source of randomness (`torch.multinomial`); None draws from torch's global
    generator, as verl does. A CPU generator seeded with s draws what verl draws after
    `torch.manual_seed(s)`.

    As in verl, the draws are with replacement, so a high-weight row may be trained on several
    times and a low-weight one not at all.
    """
    weights = pf_ppo_weights(scores=scores, reweight_method=reweight_method, weight_pow=weight_pow)
    return torch.multinomial(weights, scores.shape[0], replacement=True, generator=generator)


def _check_scores(scores: Tensor) -> None:
    if not isinstance(scores, Tensor) or scores.dim() != 1 or scores.shape[0] == 0:
        shape = tuple(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
        raise ValueError(f"PF-PPO needs scores of shape [N ≥ 1], got {shape}")
    if not torch.isfinite(scores).all():
        raise ValueError("PF-PPO scores must be finite")
