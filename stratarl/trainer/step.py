"""Layer 2, control flow: one RL step, top to bottom — docs/design.md#one-step as code.

    collect   prompts -> expand to n -> generate -> (the estimator's extra rollout) -> reward
              (rounds of it under dynamic sampling, until B prompts with signal are kept)
    learn     old log-prob -> (ref log-prob) -> (values) -> off-policy correction -> advantage
              -> (critic update) -> actor update
    then      weight sync

`RLStep.run` is the whole step; each of its lines, and each line of `collect` and `learn`, calls
one phase (`phases`, `sampling_phases`), timed under the run's `PhaseMonitor` as
`timing_s/<phase>`. What varies between algorithms and modes are objects the step is given, never a
branch on a config name: the batch source (`batch_sources`: collected now, or ahead by a producer
thread under trainer.mode=one_step_off|async, which calls `collect`), the rollout (one turn, or an
agent's episodes), where π_old comes from (`pi_old`), the off-policy correction (`correction`), the
in-reward KL (`RewardKL`), the tracer (`tracing.StepTracer`), and the frozen settings
(`step_settings`). An estimator that needs an extra rollout declares the field it reads
(`reward_baselines`: ReMax's greedy baselines); the step produces what is declared.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from rich.console import Console

from stratarl.algo.kl_control import KLController
from stratarl.assembly import datasets
from stratarl.cluster.handles import CriticHandle, PolicyHandle
from stratarl.data.prompt_dataset import PromptDataset
from stratarl.data.sampler import PromptSampler
from stratarl.objective.actor_loss import ActorLoss
from stratarl.objective.critic_loss import ValueLoss
from stratarl.observe.phase_monitor import PhaseMonitor
from stratarl.reward.manager import RewardManager
from stratarl.rollout.interface import SamplingParams
from stratarl.trainer import phases, sampling_phases
from stratarl.trainer.agent_rollout import AgentRollout
from stratarl.trainer.batch_sources import BatchSource, staleness_metrics
from stratarl.trainer.correction import NoCorrection
from stratarl.trainer.gateway_rollout import GatewayRollout
from stratarl.trainer.pi_old import OldLogProbs, with_row_ids
from stratarl.trainer.step_metrics import StepMetrics
from stratarl.trainer.step_settings import StepSettings
from stratarl.trainer.tracing import StepTracer, step_diagnostics
from stratarl.transport.data_proto import DataProto

ROUND_SEED_STRIDE = 7919  # round r of a step samples with the step's seed + r · this


class SingleTurn:
    """The rollout phase for N rows, one response each, token-in/token-out; an agent's multi-turn
    episodes take its place (`agent_rollout.AgentRollout.generate`, whose rows may come back scored:
    agent.streaming_reward)."""

    def generate(
        self,
        worker: PolicyHandle,
        batch: DataProto,
        sampling: SamplingParams,
        *,
        seed: int | None,
        rewards: RewardManager | None = None,
    ) -> tuple[DataProto, dict[str, float]]:
        return phases.generate(worker, batch, sampling, seed=seed), {}


@dataclass
class RewardKL:
    """KL in the reward (algorithm.use_kl_in_reward): r_t = s_t − β·KL_t, with β from the run's
    controller, which learns the step's KL after each step (verl's `apply_kl_penalty` + `update`).
    `controller` None: no penalty, nothing learned."""

    controller: KLController | None
    kind: str = "kl"  # algorithm.kl_penalty
    current_kl: float = 0.0  # the last advantage phase's batch KL (`actor/reward_kl_penalty`)

    def penalty(self) -> tuple[float, str] | None:
        """(β, kind) of the advantage phase, or None."""
        return None if self.controller is None else (self.controller.value, self.kind)

    def observe(self, metrics: dict[str, float]) -> None:
        """The batch KL the advantage phase reports (`apply_kl_penalty`'s current_kl)."""
        self.current_kl = metrics.get("actor/reward_kl_penalty", 0.0)

    def update(self, n_prompts: int) -> None:
        if self.controller is not None:
            self.controller.update(self.current_kl, n_steps=n_prompts)


def extra_rollouts(estimator_inputs: frozenset[str]) -> tuple[str, ...]:
    """The extra rollout phases an estimator declares by the fields it reads (ReMax: `reward_baselines`)."""
    return tuple(name for name in EXTRA_ROLLOUTS if name in estimator_inputs)


# estimator input -> (its phase name, what produces it): rollouts beyond the n samples
EXTRA_ROLLOUTS: dict[str, str] = {"reward_baselines": "gen_max"}


@dataclass
class RLStep:
    """Everything one step reads; `run(step, batches)` trains one batch (module docstring)."""

    settings: StepSettings
    train_set: PromptDataset
    sampler: PromptSampler
    tokenizer: Any
    worker: PolicyHandle
    critic: CriticHandle | None
    rewards: RewardManager
    actor_loss: ActorLoss
    value_loss: ValueLoss
    pi_old: OldLogProbs
    monitor: PhaseMonitor
    tracer: StepTracer
    version_of: Callable[[int], int]  # step -> the policy version it trains
    rollout: SingleTurn | AgentRollout | GatewayRollout = field(default_factory=SingleTurn)
    correction: Callable[[DataProto], tuple[DataProto, dict[str, float]]] = field(
        default_factory=NoCorrection
    )
    reward_kl: RewardKL = field(default_factory=lambda: RewardKL(None))
    console: Console | None = None  # where the step's warnings go (None: nowhere)

    def run(self, step: int, batches: BatchSource, *, sync_due: bool) -> tuple[DataProto, dict[str, float]]:
        """Step `step`: its batch from `batches` (collected now or ahead), learned from, the weights
        pushed (always when `sync_due`: a validation or checkpoint follows). (batch, metrics)"""
        timings: dict[str, float] = {}
        metrics = StepMetrics()
        self.tracer.begin(step)
        with self.tracer.written_on_failure(), self.monitor.phase("step", timings, step=step):
            produced, taken = batches.take(step, timings)  # prompts -> n -> generate -> reward
            self.tracer.adopt(produced.trace)  # its rollout and reward rows, traced where collected
            metrics.add("collect", produced.metrics | taken)
            produced.add_timings(timings)
            batch = self.learn(produced.batch, step, timings, metrics)
            trained_version = self.version_of(step)
            pushed = batches.push_weights(step, trained_version + 1, timings, force=sync_due)
            metrics.add("sync", pushed)
            batches.release(produced)  # its rows leave the TransferQueue, not those collected ahead
            with self.monitor.phase("trace", timings, step=step):
                self.tracer.end()
        self.reward_kl.update(len(batch) // self.settings.n)
        updated = step > self.settings.actor_warmup_steps
        metrics.add("batches", staleness_metrics(batch, trained_version) | batches.meter.take_metrics())
        metrics.add_missing(step_diagnostics(batch, trained_version if updated else None))
        metrics.add("memory", self.monitor.memory.take_metrics())
        traffic = self.controller_bytes()
        return batch, metrics.finish(
            step, batch, timings, self.settings, traffic=traffic, console=self.console
        )

    # --- the first half: rollout and reward -----------------------------------------------------
    def collect(self, step: int, timings: dict[str, float]) -> tuple[DataProto, dict[str, float]]:
        """(the step's B·n scored rows, reward/agent/batch metrics); with dynamic sampling, rounds
        until B prompts with signal are kept (the batch is cut to whole mini-batches if the cap hits)."""
        s, n = self.settings, self.settings.n
        target, kept, reward_parts, dropped, rounds = s.prompts_per_step * n, [], [], 0, 0
        while True:
            rounds += 1
            batch, parts = self.one_round(step, rounds, timings)
            reward_parts += parts
            if s.group_filter is not None:
                batch, n_dropped = sampling_phases.keep_groups_with_signal(batch, s.group_filter.metric)
                dropped += n_dropped
            kept.append(batch)
            have = sum(len(b) for b in kept)
            if s.group_filter is None or have >= target or 0 < s.group_filter.max_rounds <= rounds:
                break
        batch = DataProto.concat([b for b in kept if len(b)]) if have else kept[0]
        # without a filter, every row of the one round (an agent program's episode may give several)
        usable = (
            have if s.group_filter is None else target if have >= target else self.whole_mini_batches(have)
        )
        if usable == 0:
            cap = s.group_filter.max_rounds if s.group_filter else 1
            raise RuntimeError(
                f"step {step}: dynamic sampling kept no group with reward variance in {rounds} rounds "
                f"(algorithm.filter_groups.max_num_gen_batches={cap}); the reward gives no learning "
                "signal on this data — check the scorer, or disable filtering"
            )
        metrics = sampling_phases.sum_reward_metrics(reward_parts)
        metrics |= {"batch/gen_rounds": float(rounds), "batch/dropped_groups": float(dropped)}
        return batch.take(torch.arange(usable)), metrics

    def one_round(
        self, step: int, round_index: int, timings: dict[str, float]
    ) -> tuple[DataProto, list[dict[str, float]]]:
        """The next B prompts of the sampler, expanded to n, generated and scored."""
        s, timed = self.settings, self.timer(step, timings)
        prompts = datasets.prompts_batch(
            self.train_set, self.sampler.next_batch(), self.tokenizer.pad_token_id
        )
        batch = phases.expand_prompts(prompts, s.n, f"{step}.{round_index}")
        seed = s.step_seed(step) + ROUND_SEED_STRIDE * round_index
        with timed("gen", batch):
            batch, rollout_metrics = self.rollout.generate(
                self.worker, batch, s.sampling, seed=seed, rewards=self.rewards
            )
        self.tracer.after_rollout(batch, s.sampling, seed)
        for field_name in extra_rollouts(s.estimator_inputs):
            with timed(EXTRA_ROLLOUTS[field_name], batch):
                batch = sampling_phases.greedy_baselines(self.worker, batch, s.n, s.sampling, self.score)
        with timed("reward", batch):
            batch, result = phases.reward_unless_scored(batch, self.tokenizer, self.rewards)
        self.tracer.after_reward(batch, result)
        return batch, [rollout_metrics, result.metrics() if result is not None else {}]

    def score(self, batch: DataProto) -> DataProto:
        """`batch` with the run's reward (`token_level_scores`): ReMax's greedy baselines use it."""
        return phases.reward(batch, self.tokenizer, self.rewards)[0]

    def whole_mini_batches(self, rows: int) -> int:
        """Rows kept when dynamic sampling hit its cap short of B prompts: whole mini-batches, else
        whole groups."""
        n, mini = self.settings.n, self.settings.actor_update.mini_batch_prompts * self.settings.n
        return (rows // mini) * mini or (rows // n) * n

    # --- the second half: what the losses read, then the updates ---------------------------------
    def learn(
        self, batch: DataProto, step: int, timings: dict[str, float], metrics: StepMetrics
    ) -> DataProto:
        """π_old, π_ref, π_teacher, V, the correction, advantages (+ PF-PPO's resampling), then the critic's
        and the actor's updates; the batch with everything the phases wrote."""
        s, timed = self.settings, self.timer(step, timings)
        batch = self.pi_old.before_update(
            self.worker, batch, timed
        )  # old log-prob (or the rollout's, or none yet)
        if s.uses_reference:  # a KL loss or KL in the reward
            with timed("ref", batch):
                batch = phases.ref_log_prob(self.worker, batch)
        if s.uses_teacher:  # distillation: the teacher scores the student's own tokens
            with timed("teacher", batch):
                batch, scored = phases.teacher_log_prob(self.worker, batch, s.teacher_sources)
                metrics.add("teacher", scored)
        if self.critic is not None:
            with timed("values", batch):
                batch = phases.values(self.critic, batch)
        with timed("adv", batch):
            batch, corrected = self.correction(batch)
            metrics.add("correction", corrected)
            batch, advantaged = phases.advantage(
                batch,
                estimator=s.estimator,
                hyperparameters=dict(s.advantage_hyperparameters),
                kl_in_reward=self.reward_kl.penalty(),
                component_keys=s.component_keys,
            )
            self.tracer.after_estimator(batch, s.advantage_hyperparameters)
            self.reward_kl.observe(advantaged)
            metrics.add("advantage", advantaged)
            if s.resampling is not None:  # inside `adv`, as in verl's compute_advantage
                batch, resampled = sampling_phases.resample_by_score(
                    batch,
                    reweight_method=s.resampling.reweight_method,
                    weight_pow=s.resampling.weight_pow,
                    seed=s.step_seed(step) + 2,  # +1 is the critic's shuffle
                )
                metrics.add("resampling", resampled)
        self.tracer.after_advantage(batch)
        if self.critic is not None:
            with timed("update_critic", batch):
                metrics.add("update_critic", self.update_critic(batch, step))
        if step > s.actor_warmup_steps:  # a critic warm-up trains the critic alone first
            with timed("update_actor", batch):
                batch, updated = self.update_actor(batch, step)
            metrics.add("update_actor", updated)
        return batch

    def update_critic(self, batch: DataProto, step: int) -> dict[str, float]:
        """PPO's value update (before the actor's, as verl orders them)."""
        plan = self.settings.critic_update
        metrics = phases.update_critic(
            self.critic,
            batch,
            self.value_loss,
            mini_batch_size=plan.mini_batch_rows(self.settings.n, len(batch)),
            epochs=plan.epochs,
            seed=self.settings.step_seed(step) + 1 if plan.shuffle else None,
        )
        # the engine's perf/* of the critic's ranks, beside the actor's of the same names
        return {
            f"critic/{name}" if name.startswith("perf/") else name: value for name, value in metrics.items()
        }

    def update_actor(self, batch: DataProto, step: int) -> tuple[DataProto, dict[str, float]]:
        """The policy update; π_old enters the batch after it when the update's forward computed it."""
        plan, wants_rows = self.settings.actor_update, self.pi_old.from_update or self.tracer.enabled
        metrics = phases.update_actor(
            self.worker,
            with_row_ids(batch) if wants_rows else batch,
            self.actor_loss,
            mini_batch_size=plan.mini_batch_rows(self.settings.n, len(batch)),
            epochs=plan.epochs,
            seed=self.settings.step_seed(step) if plan.shuffle else None,
        )
        row_stats = self.worker.update_row_statistics() if wants_rows else {}
        batch = self.pi_old.after_update(batch, row_stats)
        self.tracer.after_update(batch, row_stats, self.version_of(step))
        return batch, metrics

    # --- around the phases ----------------------------------------------------------------------
    def timer(self, step: int, timings: dict[str, float]) -> Callable[[str, DataProto], Any]:
        """(phase name, batch) -> the block timed into `timings` under the run's monitor."""

        @contextmanager
        def timed(name: str, batch: DataProto) -> Iterator[None]:
            with self.monitor.phase(name, timings, step=step, rows=len(batch)):
                yield

        return timed

    def controller_bytes(self) -> dict[str, float]:
        """What crossed process boundaries through the controller this step (0 in one process)."""
        traffic = self.worker.controller_bytes()
        if self.critic is not None:  # the critic's ranks are processes too
            critic_traffic = self.critic.controller_bytes()
            traffic = {key: value + critic_traffic.get(key, 0.0) for key, value in traffic.items()}
        return traffic
