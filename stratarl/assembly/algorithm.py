"""Assembly: the algorithm's pieces from `actor.*`, `critic.*`, `algorithm.*` and `rollout.*`.

The actor's and the critic's losses (`stratarl.objective`), the advantage estimator's
hyper-parameters and the fields it reads, the controller of β when KL is in the reward, the
rollout correction's settings, and how the rollout phase samples (training and validation).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from stratarl.algo.advantages import get_advantage_estimator
from stratarl.algo.kl_control import KLController, make_kl_controller
from stratarl.config import RunConfig
from stratarl.objective.actor_loss import ActorLoss
from stratarl.objective.critic_loss import ValueLoss
from stratarl.objective.distillation_term import DistillationTerm
from stratarl.rollout.interface import SamplingParams


def rollout_correction_settings(cfg: RunConfig) -> dict[str, Any]:
    """Keyword arguments of `algo.rollout_correction.rollout_correction` from algorithm.rollout_correction."""
    rc = cfg.algorithm.rollout_correction
    return {
        "rollout_is": rc.rollout_is,
        "rollout_is_threshold": rc.rollout_is_threshold,
        "rollout_is_batch_normalize": rc.rollout_is_batch_normalize,
        "rollout_rs": rc.rollout_rs,
        "rollout_rs_threshold": rc.rollout_rs_threshold,
    }


# algorithm.rollout_correction.loss_type -> the policy loss bypass mode trains with
BYPASS_LOSSES = {"ppo_clip": "vanilla", "reinforce": "reinforce"}


def build_actor_loss(cfg: RunConfig, *, old_log_prob_from_forward: bool = False) -> ActorLoss:
    """The actor's loss; old_log_prob_from_forward: π_old from the update's forward (`pi_old.FromUpdate`)."""
    settings = asdict(cfg.actor.policy_loss)
    name = settings.pop("name")
    bypass = cfg.algorithm.rollout_correction.bypass_mode
    if bypass:  # verl forces the loss: PPO clip against π_rollout, or REINFORCE with IS weights
        name = BYPASS_LOSSES[cfg.algorithm.rollout_correction.loss_type]
    return ActorLoss.from_settings(
        name,
        settings,
        bypass_correction=rollout_correction_settings(cfg) if bypass else None,
        loss_agg_mode=cfg.actor.loss_agg_mode,
        loss_scale_factor=cfg.actor.loss_scale_factor,
        entropy_coeff=cfg.actor.entropy_coeff,
        kl_loss_coef=cfg.actor.kl_loss_coef if cfg.actor.use_kl_loss else 0.0,
        kl_loss_type=cfg.actor.kl_loss_type,
        clip_bounds=(cfg.actor.policy_loss.clip_ratio_low, cfg.actor.policy_loss.clip_ratio_high),
        old_log_prob_from_forward=old_log_prob_from_forward,
        distillation=distillation_term(cfg),
    )


def distillation_term(cfg: RunConfig) -> DistillationTerm | None:
    """distillation.*'s term of the actor's loss; None when distillation is off."""
    d = cfg.distillation
    if not d.enabled:
        return None
    return DistillationTerm(
        loss_mode=d.loss_mode,
        use_policy_gradient=d.use_policy_gradient,
        use_task_rewards=d.use_task_rewards,
        distillation_loss_coef=d.distillation_loss_coef,
        loss_max_clamp=d.loss_max_clamp,
        clip_ratio_low=d.clip_ratio_low,
        clip_ratio_high=d.clip_ratio_high,
        log_prob_min_clamp=d.log_prob_min_clamp,
        top_k=d.topk,
    )


def advantage_hyperparameters(cfg: RunConfig) -> dict[str, Any]:
    a = cfg.algorithm
    return {
        "gamma": a.gamma,
        "lam": a.lam,
        "norm_adv_by_std": a.norm_adv_by_std,
        "weights": list(a.gdpo_reward_weights) or None,  # gdpo only; None keeps equal weights
    }


def build_kl_controller(cfg: RunConfig) -> KLController | None:
    """algorithm.kl_ctrl's controller of β when KL is in the reward (use_kl_in_reward); else None."""
    a = cfg.algorithm
    if not a.use_kl_in_reward:
        return None
    c = a.kl_ctrl
    return make_kl_controller(c.type, kl_coef=c.kl_coef, target_kl=c.target_kl, horizon=c.horizon)


def build_value_loss(cfg: RunConfig) -> ValueLoss:
    return ValueLoss(cliprange_value=cfg.critic.cliprange_value, loss_agg_mode=cfg.critic.loss_agg_mode)


def estimator_inputs(cfg: RunConfig) -> frozenset[str]:
    """The batch fields the configured advantage estimator requires (e.g. values, sum_pi_squared)."""
    return get_advantage_estimator(cfg.algorithm.adv_estimator).inputs


def train_sampling(cfg: RunConfig) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=max(r.top_k, 0),
        max_tokens=r.max_response_tokens,
        ignore_eos=r.ignore_eos,
        min_tokens=r.min_response_tokens,
    )


def val_sampling(cfg: RunConfig) -> SamplingParams:
    v = cfg.rollout.val_kwargs
    return SamplingParams(
        temperature=0.0 if v.greedy else v.temperature,
        top_p=v.top_p,
        top_k=max(v.top_k, 0),
        max_tokens=cfg.rollout.max_response_tokens,
    )
