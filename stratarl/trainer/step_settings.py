"""Layer 2, control flow: what one RL step reads of the run's config, resolved once and frozen.

`StepSettings.from_config` is the only place the step's phases get their numbers from a `RunConfig`:
the step (`step.RLStep`) and the objects it is given read these fields, never the config, so a
setting is read at one place and a step can be built by hand (tests, notebooks) without one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from stratarl.assembly import algorithm
from stratarl.config import RunConfig
from stratarl.rollout.interface import SamplingParams


@dataclass(frozen=True)
class GroupFilter:
    """DAPO's dynamic sampling (algorithm.filter_groups): keep the groups whose `metric` varies,
    generating more rounds until B prompts are kept or `max_rounds` were run (0: no cap)."""

    metric: str
    max_rounds: int


@dataclass(frozen=True)
class UpdatePlan:
    """One role's optimizer steps on a batch: mini-batches of `mini_batch_prompts` prompts (× n rows),
    `epochs` passes, rows shuffled with the step's seed when `shuffle`."""

    mini_batch_prompts: int
    epochs: int
    shuffle: bool

    def mini_batch_rows(self, n: int, rows: int) -> int:
        return min(self.mini_batch_prompts * n, rows)


@dataclass(frozen=True)
class Resampling:
    """PF-PPO (algorithm.use_pf_ppo): the rows the update trains on, redrawn by score."""

    reweight_method: str
    weight_pow: float


@dataclass(frozen=True)
class StepSettings:
    n: int  # rollout.n: samples per prompt
    prompts_per_step: int  # B
    sampling: SamplingParams  # the rollout's, for training batches
    group_filter: GroupFilter | None  # None: one round, every group kept
    estimator: str  # algorithm.adv_estimator
    advantage_hyperparameters: Mapping[str, Any]
    component_keys: tuple[str, ...]  # GDPO's reward components
    resampling: Resampling | None
    actor_update: UpdatePlan
    critic_update: UpdatePlan
    actor_warmup_steps: int  # steps the critic trains alone before the actor's first update
    uses_reference: bool  # a KL loss or KL in the reward: the ref log-prob phase runs
    uses_teacher: bool  # distillation.enabled: the teacher log-prob phase runs
    teacher_sources: frozenset[str]  # distillation.teachers: the data sources with a teacher of their own
    loss_agg_mode: str  # the actor's, for the logged entropy
    max_prompt_tokens: int
    seed: int  # trainer.seed: every step's seeds derive from it
    estimator_inputs: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def from_config(cls, cfg: RunConfig) -> StepSettings:
        a, f = cfg.algorithm, cfg.algorithm.filter_groups
        return cls(
            n=cfg.rollout.n,
            prompts_per_step=cfg.data.prompts_per_step,
            sampling=algorithm.train_sampling(cfg),
            group_filter=GroupFilter(f.metric, f.max_num_gen_batches) if f.enable else None,
            estimator=a.adv_estimator,
            advantage_hyperparameters=MappingProxyType(algorithm.advantage_hyperparameters(cfg)),
            component_keys=tuple(a.gdpo_reward_keys),
            resampling=Resampling(a.pf_ppo.reweight_method, a.pf_ppo.weight_pow) if a.use_pf_ppo else None,
            actor_update=UpdatePlan(
                cfg.actor.prompts_per_mini_batch, cfg.actor.ppo_epochs, cfg.actor.shuffle
            ),
            # the critic's shuffle follows the actor's (actor.shuffle), as verl's trainer does
            critic_update=UpdatePlan(
                cfg.critic.prompts_per_mini_batch, cfg.critic.ppo_epochs, cfg.actor.shuffle
            ),
            actor_warmup_steps=cfg.critic.warmup_training_steps if cfg.uses_critic else 0,
            uses_reference=cfg.uses_reference,
            uses_teacher=cfg.distillation.enabled,
            teacher_sources=frozenset(cfg.distillation.teachers),
            loss_agg_mode=cfg.actor.loss_agg_mode,
            max_prompt_tokens=cfg.data.max_prompt_tokens,
            seed=cfg.trainer.seed,
            estimator_inputs=algorithm.estimator_inputs(cfg),
        )

    def step_seed(self, step: int) -> int:
        """The seed step `step`'s sampling and shuffles derive from."""
        return self.seed * 1_000_003 + step * 10_007
