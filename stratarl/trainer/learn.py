"""Layer 2, control flow: the learning half of a step — docs/design.md#one-step after the reward.

    old log-prob -> (ref log-prob) -> (values) -> (rollout correction) -> advantage -> (PF-PPO)
                 -> critic update -> actor update

`StepLearner.prepare` computes what the losses read (π_old, π_ref, V, the correction's weights,
advantages, and with PF-PPO the rows redrawn by score); `update_critic` and `update_actor` run the
optimizer steps, each phase under the run's `PhaseMonitor`. When π_old comes from the update's own
forward (`on_policy`), `prepare` skips the old-log-prob forward and `update_actor` writes the columns
that forward computed. The trainer (`rl_trainer.RLTrainer.train_step`) calls them in that order and
owns everything around them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from stratarl.algo.kl_control import KLController
from stratarl.cluster.handles import CriticHandle, PolicyHandle
from stratarl.config import RunConfig
from stratarl.observe.phase_monitor import PhaseMonitor
from stratarl.trainer import builders, on_policy, phases, sampling_phases, training_modes
from stratarl.trainer.actor_loss import ActorLoss
from stratarl.trainer.critic_loss import ValueLoss
from stratarl.trainer.tracing import StepTracer
from stratarl.transport.data_proto import DataProto


@dataclass
class StepLearner:
    """What the learning half of a step reads: the policy (and critic), the losses, the KL
    controller of an in-reward penalty, and the run's monitor and tracer."""

    cfg: RunConfig
    worker: PolicyHandle
    critic: CriticHandle | None
    loss_fn: ActorLoss
    value_loss: ValueLoss
    kl_ctrl: KLController | None  # None unless KL is in the reward
    monitor: PhaseMonitor
    tracer: StepTracer
    step_seed: Callable[[int], int]  # step -> the seed its shuffles derive from

    def __post_init__(self) -> None:
        self.needs_sum_pi_squared = "sum_pi_squared" in builders.estimator_inputs(self.cfg)

    def update_actor(
        self, batch: DataProto, step: int, timings: dict[str, float], trained_version: int
    ) -> tuple[DataProto, dict[str, float]]:
        """The policy update; when π_old comes from its forward (`on_policy`), the batch gets the
        `old_log_probs` and `entropys` that forward computed."""
        cfg, from_forward = self.cfg, self.loss_fn.old_log_prob_from_forward
        update_batch = self.tracer.with_row_ids(batch)
        with self.monitor.phase("update_actor", timings, step=step, rows=len(batch)):
            metrics = phases.update_actor(
                self.worker,
                on_policy.with_row_ids(update_batch) if from_forward else update_batch,
                self.loss_fn,
                mini_batch_size=min(cfg.actor.prompts_per_mini_batch * cfg.rollout.n, len(batch)),
                epochs=cfg.actor.ppo_epochs,
                seed=self.step_seed(step) if cfg.actor.shuffle else None,
            )
        worker = self.worker
        row_stats = worker.update_row_statistics() if from_forward else self.tracer.row_statistics(worker)
        if from_forward:
            batch = on_policy.old_log_probs_from_update(batch, row_stats)
            self.tracer.after_log_probs(batch)
        self.tracer.after_update(batch, row_stats, trained_version)
        return batch, metrics

    def prepare(
        self, batch: DataProto, timings: dict[str, float], step: int
    ) -> tuple[DataProto, dict[str, float]]:
        """Old and reference log-probs, rollout correction, advantages, then PF-PPO's resampling."""
        cfg, metrics, rows = self.cfg, {}, len(batch)
        correction, settings = cfg.algorithm.rollout_correction, training_modes.correction_settings(cfg)
        if correction.bypass_mode:
            batch = sampling_phases.use_rollout_log_probs(batch)
        elif not self.loss_fn.old_log_prob_from_forward:  # else the update's forward writes them
            with self.monitor.phase("old_log_prob", timings, step=step, rows=rows):
                batch = phases.old_log_prob(self.worker, batch, with_sum_pi_squared=self.needs_sum_pi_squared)
        if cfg.uses_reference:
            with self.monitor.phase("ref", timings, step=step, rows=rows):
                batch = phases.ref_log_prob(self.worker, batch)
        if self.critic is not None:
            with self.monitor.phase("values", timings, step=step, rows=rows):
                batch = phases.values(self.critic, batch)
        with self.monitor.phase("adv", timings, step=step, rows=rows):
            if settings is not None:  # decoupled: π_old/π_rollout weights and rejection (training_modes)
                batch, metrics = sampling_phases.apply_decoupled_correction(batch, settings)
            batch, adv_metrics = phases.advantage(
                batch,
                estimator=cfg.algorithm.adv_estimator,
                hyperparameters=builders.advantage_hyperparameters(cfg),
                kl_in_reward=(self.kl_ctrl.value, cfg.algorithm.kl_penalty) if self.kl_ctrl else None,
                component_keys=cfg.algorithm.gdpo_reward_keys,
            )
            if cfg.algorithm.use_pf_ppo:  # inside `adv`, as in verl's compute_advantage
                pf = cfg.algorithm.pf_ppo
                batch, pf_metrics = sampling_phases.resample_by_score(
                    batch,
                    reweight_method=pf.reweight_method,
                    weight_pow=pf.weight_pow,
                    seed=self.step_seed(step) + 2,  # +1 is the critic's shuffle
                )
                adv_metrics |= pf_metrics
        return batch, metrics | adv_metrics

    def update_critic(self, batch: DataProto, step: int, timings: dict[str, float]) -> dict[str, float]:
        """PPO's value update (before the actor's, as verl orders them); {} without a critic."""
        if self.critic is None:
            return {}
        c = self.cfg.critic
        with self.monitor.phase("update_critic", timings, step=step, rows=len(batch)):
            return phases.update_critic(
                self.critic,
                batch,
                self.value_loss,
                mini_batch_size=min(c.prompts_per_mini_batch * self.cfg.rollout.n, len(batch)),
                epochs=c.ppo_epochs,
                seed=self.step_seed(step) + 1 if self.cfg.actor.shuffle else None,
            )
