"""Layer 6, RL math: the one rollout-correction call of a training step (verl's
`compute_rollout_correction_and_rejection_mask`): IS weights, rejection mask and diagnostics together.
"""

from __future__ import annotations

from torch import Tensor

from stratarl.algo.rollout_correction.diagnostics import offpolicy_metrics, with_prefix
from stratarl.algo.rollout_correction.is_weights import rollout_is_weights
from stratarl.algo.rollout_correction.rejection import rejection_mask


def rollout_correction(
    old_log_prob: Tensor,  # [N, T] log π_train (π_old in decoupled mode)
    rollout_log_prob: Tensor,  # [N, T] log π_rollout
    response_mask: Tensor,  # [N, T]
    *,
    rollout_is: str | None = None,
    rollout_is_threshold: str | float | None = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: str | float | None = None,
) -> tuple[Tensor | None, Tensor, dict[str, float]]:
    """(IS weights [N, T] or None, response mask after rejection [N, T], `rollout_corr/*` metrics).

    Weights are computed when `rollout_is` ("token" | "sequence") and its threshold are set; the
    mask is the input mask unless `rollout_rs` is set. Rejection does not change the IS weights, and
    the diagnostics use the input mask, as in verl. The trainer replaces `response_mask` with the
    returned mask and multiplies per-token policy losses by the weights.
    """
    if not response_mask.any():
        raise ValueError("response_mask must contain at least one valid token")
    for name, tensor in (("old_log_prob", old_log_prob), ("rollout_log_prob", rollout_log_prob)):
        if tensor.shape != response_mask.shape:
            raise ValueError(
                f"{name} {tuple(tensor.shape)} must match response_mask {tuple(response_mask.shape)}"
            )
    log_ratio = old_log_prob - rollout_log_prob  # [N, T]
    metrics: dict[str, float] = {}
    weights = None
    if rollout_is is not None and rollout_is_threshold is not None:
        weights, is_metrics = rollout_is_weights(
            log_ratio,
            response_mask,
            level=rollout_is,
            threshold=rollout_is_threshold,
            batch_normalize=rollout_is_batch_normalize,
        )
        metrics.update(is_metrics)
    new_mask = response_mask.clone()
    if rollout_rs is not None:
        new_mask, rs_metrics = rejection_mask(log_ratio, response_mask, rollout_rs, rollout_rs_threshold)
        metrics.update(rs_metrics)
    metrics.update(offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask))
    return weights, new_mask, with_prefix(metrics)
