"""Layer 2, control flow: the collect phase of a step — B prompts × n rolled out and scored.

`BatchCollector.collect(step)` is the first half of docs/design.md#one-step: prompts -> expand to n ->
generate (one turn, or the agent's multi-turn episodes) -> (ReMax's greedy baselines) -> reward,
each phase under the run's `PhaseMonitor` and followed by its trace fields. With DAPO's dynamic
sampling (`algorithm.filter_groups`) it runs rounds of that until B prompts whose groups carry
signal are kept, or the round cap is hit. What the rest of the step does with the batch is the
trainer's (`rl_trainer.RLTrainer.train_step`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from stratarl.cluster.handles import PolicyHandle
from stratarl.config import RunConfig
from stratarl.data.prompt_dataset import PromptDataset
from stratarl.data.sampler import PromptSampler
from stratarl.observe.phase_monitor import PhaseMonitor
from stratarl.reward.manager import RewardManager
from stratarl.rollout.interface import SamplingParams
from stratarl.trainer import builders, phases, sampling_phases
from stratarl.trainer.agent_rollout import AgentRollout
from stratarl.trainer.tracing import StepTracer
from stratarl.transport.data_proto import DataProto

ROUND_SEED_STRIDE = 7919  # round r of a step samples with the step's seed + r · this


@dataclass
class BatchCollector:
    """Everything the collect phase reads: the run's data, policy, rollout settings and reward."""

    cfg: RunConfig
    train_set: PromptDataset
    sampler: PromptSampler
    tokenizer: Any
    worker: PolicyHandle
    sampling: SamplingParams
    rewards: RewardManager
    monitor: PhaseMonitor
    tracer: StepTracer
    step_seed: Callable[[int], int]  # step -> the seed its sampling derives from
    agent: AgentRollout | None = None  # agent.enable: multi-turn episodes with tools

    def collect(self, step: int, timings: dict[str, float]) -> tuple[DataProto, dict[str, float]]:
        """(the step's B·n scored rows, reward/agent/batch metrics); with dynamic sampling, rounds
        until B prompts with signal are kept (the batch is cut to whole mini-batches if the cap hits)."""
        cfg, n = self.cfg, self.cfg.rollout.n
        filtering = cfg.algorithm.filter_groups
        target, kept, reward_parts, dropped, rounds = cfg.data.prompts_per_step * n, [], [], 0, 0
        while True:
            rounds += 1
            batch, parts = self.one_round(step, rounds, timings)
            reward_parts += parts
            if filtering.enable:
                batch, n_dropped = sampling_phases.keep_groups_with_signal(batch, filtering.metric)
                dropped += n_dropped
            kept.append(batch)
            have = sum(len(b) for b in kept)
            cap_hit = filtering.max_num_gen_batches > 0 and rounds >= filtering.max_num_gen_batches
            if not filtering.enable or have >= target or cap_hit:
                break
        batch = DataProto.concat([b for b in kept if len(b)]) if have else kept[0]
        mini = cfg.actor.prompts_per_mini_batch * n
        usable = target if have >= target else (have // mini) * mini or (have // n) * n
        if usable == 0:
            raise RuntimeError(
                f"step {step}: dynamic sampling kept no group with reward variance in {rounds} rounds "
                f"(algorithm.filter_groups.max_num_gen_batches={filtering.max_num_gen_batches}); the "
                "reward gives no learning signal on this data — check the scorer, or disable filtering"
            )
        metrics = sampling_phases.sum_reward_metrics(reward_parts)
        metrics |= {"batch/gen_rounds": float(rounds), "batch/dropped_groups": float(dropped)}
        return batch.take(torch.arange(usable)), metrics

    def one_round(
        self, step: int, round_index: int, timings: dict[str, float]
    ) -> tuple[DataProto, list[dict[str, float]]]:
        """The next B prompts of the sampler, expanded to n, generated and scored."""
        n, phase, reward_parts = self.cfg.rollout.n, self.monitor.phase, []
        prompts = builders.prompts_batch(
            self.train_set, self.sampler.next_batch(), self.tokenizer.pad_token_id
        )
        batch = phases.expand_prompts(prompts, n, f"{step}.{round_index}")
        seed = self.step_seed(step) + ROUND_SEED_STRIDE * round_index
        with phase("gen", timings, step=step, rows=len(batch)):
            if self.agent is None:
                batch = phases.generate(self.worker, batch, self.sampling, seed=seed)
            else:  # multi-turn episodes; their agent/* metrics join the reward's
                batch, agent_metrics = self.agent.generate(
                    self.worker, batch, self.sampling, seed=seed, rewards=self.rewards
                )
                reward_parts.append(agent_metrics)
        self.tracer.after_rollout(batch, self.sampling, seed)
        if self.cfg.algorithm.adv_estimator == "remax":
            with phase("gen_max", timings, step=step, rows=len(batch)):
                batch = sampling_phases.greedy_baselines(self.worker, batch, n, self.sampling, self.score)
        result = None  # agent.streaming_reward scored the episodes while generating
        if "token_level_scores" not in batch:
            with phase("reward", timings, step=step, rows=len(batch)):
                batch, result, _ = phases.reward(batch, self.tokenizer, self.rewards)
            reward_parts.append(result.metrics())
        self.tracer.after_reward(batch, result)
        return batch, reward_parts

    def score(self, batch: DataProto) -> DataProto:
        """`batch` with the run's reward (`token_level_scores`): ReMax's greedy baselines use it."""
        return phases.reward(batch, self.tokenizer, self.rewards)[0]
