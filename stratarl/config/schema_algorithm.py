"""Layer 1, config: how rewards become advantages — `algorithm.*` (estimator, discounting, in-reward KL,
and which trajectories are trained on: dynamic sampling, PF-PPO, rollout correction).

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
class FilterGroupsConfig:
    """DAPO's dynamic sampling: drop groups without learning signal, generate more until B prompts."""

    enable: bool = setting(
        False, "drop groups whose metric has zero variance", verl="algorithm.filter_groups.enable"
    )
    metric: str = setting(
        "score",
        "per-trajectory value whose variance is checked: score, or a key the scorer returns (e.g. acc)",
        verl="algorithm.filter_groups.metric",
    )
    max_num_gen_batches: int = setting(
        10,
        "most generation rounds per step before training on what was kept; 0: no cap",
        verl="algorithm.filter_groups.max_num_gen_batches",
    )


@dataclass
class PFPPOConfig:
    """PF-PPO (arXiv:2409.06957): after the advantage, N rows redrawn with replacement by score weights."""

    reweight_method: str = setting(
        "pow",
        "weight of a trajectory of score R: pow |R|^weight_pow; max_min 1 at the batch's max or min "
        "score, else 0; max_random 0.4 at the max, else 0.1 (algo.policy_filtration.PF_PPO_WEIGHTS)",
        verl="algorithm.pf_ppo.reweight_method",
    )
    weight_pow: float = setting(
        2.0, "pow: the exponent p of |R|^p (unitless, ≥ 0)", verl="algorithm.pf_ppo.weight_pow"
    )


@dataclass
class RolloutCorrectionConfig:
    """Correction for the rollout engine's policy differing from the trainer's (algo/rollout_correction)."""

    rollout_is: str | None = setting(
        None,
        "importance weights π_train/π_rollout: token, sequence, or null (off)",
        verl="algorithm.rollout_correction.rollout_is",
        choices=("token", "sequence"),
    )
    rollout_is_threshold: float = setting(
        2.0,
        "upper truncation of the IS weights (TIS)",
        verl="algorithm.rollout_correction.rollout_is_threshold",
    )
    rollout_is_batch_normalize: bool = setting(
        False,
        "rescale IS weights to mean 1 over the batch",
        verl="algorithm.rollout_correction.rollout_is_batch_normalize",
    )
    rollout_rs: str | None = setting(
        None,
        "rejection-sampling options, comma-separated (e.g. seq_mean_k1,token_k3); null: off",
        verl="algorithm.rollout_correction.rollout_rs",
    )
    rollout_rs_threshold: str | None = setting(
        None,
        "thresholds of rollout_rs, one per option or one for all (k1 options: lower_upper)",
        verl="algorithm.rollout_correction.rollout_rs_threshold",
    )
    bypass_mode: bool = setting(
        False,
        "old log-probs are the rollout's (no recompute forward; 2 policies instead of 3)",
        verl="algorithm.rollout_correction.bypass_mode",
    )
    loss_type: str = setting(
        "ppo_clip",
        "bypass mode's loss: ppo_clip (ratio against π_rollout) or reinforce (−w·A·log π)",
        verl="algorithm.rollout_correction.loss_type",
        choices=("ppo_clip", "reinforce"),
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
    gdpo_reward_keys: list[str] = setting(
        [],
        "gdpo: reward components (keys the scorer returns), each normalised in its group",
        verl="algorithm.gdpo_reward_keys",
    )
    gdpo_reward_weights: list[float] = setting(
        [], "gdpo: weight of each component; empty: equal weights", verl="algorithm.gdpo_reward_weights"
    )
    filter_groups: FilterGroupsConfig = section(FilterGroupsConfig, "DAPO dynamic sampling")
    use_pf_ppo: bool = setting(
        False,
        "PF-PPO: train on N trajectories redrawn by weights of their scores (algorithm.pf_ppo), after "
        "the advantage; with every estimator (verl 0.9.1 applies it with gae only)",
        verl="algorithm.use_pf_ppo",
    )
    pf_ppo: PFPPOConfig = section(PFPPOConfig, "PF-PPO's weighting of a trajectory's score")
    rollout_correction: RolloutCorrectionConfig = section(
        RolloutCorrectionConfig, "importance weights and rejection for rollout/trainer mismatch"
    )
