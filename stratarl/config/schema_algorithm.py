"""Layer 1, config: how rewards become advantages — `algorithm.*` (estimator, discounting, in-reward KL).

The names of estimators and KL estimators are those of the registries in `stratarl/algo/`;
`validate_config` checks them there, so a new estimator needs no change here.
"""

from __future__ import annotations

from dataclasses import dataclass

from stratarl.config.setting import section, setting


@dataclass
class KLControlConfig:
    """The weight β of the in-reward KL penalty and how it moves (algo/kl_control.py)."""

    type: str = setting(
        "fixed", "controller: fixed keeps β, adaptive steers toward target_kl", verl="algorithm.kl_ctrl.type"
    )
    kl_coef: float = setting(0.001, "β, or its starting value for adaptive", verl="algorithm.kl_ctrl.kl_coef")
    target_kl: float = setting(
        0.1, "adaptive: the KL per token it steers toward", verl="algorithm.kl_ctrl.target_kl"
    )
    horizon: int = setting(
        10000, "adaptive: trajectories over which β adjusts fully", verl="algorithm.kl_ctrl.horizon"
    )


@dataclass
class AlgorithmConfig:
    """The advantage estimator and the reward shaping before it."""

    adv_estimator: str = setting(
        "grpo",
        "advantage estimator (a name in stratarl.algo.advantages.ADVANTAGE_ESTIMATORS)",
        verl="algorithm.adv_estimator",
    )
    gamma: float = setting(1.0, "discount factor per token", verl="algorithm.gamma")
    lam: float = setting(1.0, "GAE λ", verl="algorithm.lam")
    norm_adv_by_std: bool = setting(
        True,
        "GRPO divides by the group's std; false gives Dr. GRPO",
        verl="algorithm.norm_adv_by_std_in_grpo",
    )
    use_kl_in_reward: bool = setting(
        False, "subtract β·KL(actor‖reference) from the token rewards", verl="algorithm.use_kl_in_reward"
    )
    kl_penalty: str = setting("kl", "KL estimator of the in-reward penalty", verl="algorithm.kl_penalty")
    kl_ctrl: KLControlConfig = section(KLControlConfig, "the in-reward KL weight β")
