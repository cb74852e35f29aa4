"""Layer 6, RL math: the names of the layer's registered variants and what config validation must
know of them, without importing torch.

`stratarl train` checks a recipe before torch loads (importing it takes seconds, 14 s on a loaded
2-core machine), so a typo in a name is reported at once. The registries beside the code
(`ADVANTAGE_ESTIMATORS`, `POLICY_LOSSES`, `LOSS_AGGREGATIONS`, `KL_ESTIMATORS`, `KL_CONTROLLERS`,
`PF_PPO_WEIGHTS`) stay the truth; tests/algo/test_catalog.py fails when this file and they disagree.
"""

from __future__ import annotations

_OUTCOME = frozenset({"token_level_rewards", "response_mask"})
_GROUPED = _OUTCOME | {"group"}
_OPTIMAL_TOKEN_BASELINE = _GROUPED | {"old_log_prob", "sum_pi_squared"}

# Estimator name -> the batch fields it requires (`AdvantageEstimator.inputs`).
ESTIMATOR_INPUTS: dict[str, frozenset[str]] = {
    "gae": _OUTCOME | {"values"},
    "grpo": _GROUPED,
    "grpo_vectorized": _GROUPED,
    "grpo_passk": _GROUPED,
    "gdpo": frozenset({"component_scores", "response_mask", "group"}),
    "rloo": _GROUPED,
    "rloo_vectorized": _GROUPED,
    "opo": _GROUPED,
    "gpg": _GROUPED,
    "reinforce_plus_plus_baseline": _GROUPED,
    "reinforce_plus_plus": _OUTCOME,
    "remax": _OUTCOME | {"reward_baselines"},
    "optimal_token_baseline": _OPTIMAL_TOKEN_BASELINE,
    "tir_optimal_token_baseline": _OPTIMAL_TOKEN_BASELINE,
}

# Policy-loss name -> the aggregation it forces, or None where `actor.loss_agg_mode` applies.
POLICY_LOSS_AGGREGATION: dict[str, str | None] = {
    "vanilla": None,
    "gspo": None,
    "geo_mean": "seq-mean-token-sum",
    "sapo": "seq-mean-token-mean",
    "clip_cov": None,
    "kl_cov": None,
    "gpg": None,
    "cispo": None,
    "dro": None,
    "dppo_tv": None,
    "dppo_kl": None,
    "reinforce": None,
}

LOSS_AGGREGATION_NAMES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)

# Each per-token KL estimator, and its straight-through form (name + "+": its value, k2's gradient).
_KL_BASE_NAMES = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl")
KL_ESTIMATOR_NAMES = (*_KL_BASE_NAMES, *(name + "+" for name in _KL_BASE_NAMES))

KL_CONTROLLER_NAMES = ("fixed", "adaptive")

# PF-PPO's weightings of a trajectory's score (`algo/policy_filtration.py`, verl's reweight_method).
PF_PPO_REWEIGHT_METHODS = ("pow", "max_min", "max_random")

# On-policy distillation losses (`algo/distillation/`, verl's distillation_loss.loss_mode): the name ->
# (needs the teacher's top-k, teaches when backpropagated directly).
DISTILLATION_LOSS_KINDS: dict[str, tuple[bool, bool]] = {
    "k1": (False, False),
    "kl": (False, False),
    "abs": (False, True),
    "k2": (False, True),
    "mse": (False, True),
    "k3": (False, True),
    "low_var_kl": (False, True),
    "forward_kl_topk": (True, True),
}
