"""Layer 6, RL math: rollout correction, for trajectories sampled by a policy that differs from the one
being trained (inference-engine numerics, stale weights). verl's `rollout_corr_helper`, in parts:
importance weights (`is_weights`), rejection sampling (`rejection`, `rs_metrics`), off-policy
diagnostics (`diagnostics`) and the one call that combines them (`combined`).
"""

from stratarl.algo.rollout_correction.combined import rollout_correction
from stratarl.algo.rollout_correction.diagnostics import offpolicy_metrics, rollout_corr_metrics, with_prefix
from stratarl.algo.rollout_correction.is_weights import (
    IS_LEVELS,
    SAFETY_BOUND,
    is_weight_sum_and_count,
    normalize_is_weights,
    rollout_is_weights,
)
from stratarl.algo.rollout_correction.rejection import RS_OPTIONS, rejection_mask

__all__ = [
    "IS_LEVELS",
    "RS_OPTIONS",
    "SAFETY_BOUND",
    "is_weight_sum_and_count",
    "normalize_is_weights",
    "offpolicy_metrics",
    "rejection_mask",
    "rollout_corr_metrics",
    "rollout_correction",
    "rollout_is_weights",
    "with_prefix",
]
