"""Layer 2, control flow: the trainer's side of the trace — after each phase, the fields that phase
knows about every traced trajectory (`observe.trace_fields`), one parquet file per step.

    tracer.begin(step)
    batch = generate(...);         tracer.after_rollout(batch, sampling, seed)   # Q1-Q6
    batch = reward(...);           tracer.after_reward(batch, result)            # Q7
    batch = log-probs, advantage;  tracer.after_estimator(batch, hyperparameters)  # Q8: μ, σ, ε
                                   tracer.after_advantage(batch)                 # Q8, Q9 before
    update_actor(batch with row_id);  tracer.after_update(batch, row_stats, v)  # Q9 new, Q10
    tracer.end()

With trace.enable=false every call returns at once and the batch is never touched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from stratarl.algo.advantages import get_advantage_estimator
from stratarl.algo.groups import group_ids_from_uids
from stratarl.algo.rollout_correction.diagnostics import rollout_corr_metrics
from stratarl.config import RunConfig
from stratarl.observe import trace_fields as fields
from stratarl.observe.trace_store import StepTrace, TraceWriter
from stratarl.reward.batch_scorer import RewardResult
from stratarl.reward.registry import SCORERS
from stratarl.rollout.interface import SamplingParams
from stratarl.transport.data_proto import DataProto


def reward_source_describer(cfg: RunConfig) -> Callable[[str], str]:
    """data_source -> where its reward comes from: the custom function by path, or the rule scorer
    the registry dispatches to (verl's default_compute_score)."""
    r = cfg.reward
    if r.custom_function_path:
        where = f"function {r.custom_function_path}:{r.custom_function_name}"
        return lambda data_source: where
    streaming = " (scored while generating)" if cfg.agent.enable and cfg.agent.streaming_reward else ""

    def describe(data_source: str) -> str:
        return (
            f"rule function {_scorer_name(SCORERS.get(data_source))} (data_source {data_source!r}){streaming}"
        )

    return describe


def _scorer_name(scorer: Any) -> str:
    if scorer is None:
        return "(none registered)"
    if hasattr(scorer, "__qualname__"):  # a function; a LazyScorer instance names itself
        return f"{scorer.__module__}.{scorer.__qualname__}"
    return repr(scorer)


class StepTracer:
    """Collects the trace of the current step and writes it at its end (`trace.*` settings)."""

    def __init__(self, cfg: RunConfig, tokenizer: Any, run_dir: str | Path):
        t = cfg.trace
        self.enabled = t.enable
        self.n, self.estimator = cfg.rollout.n, cfg.algorithm.adv_estimator
        loss = cfg.actor.policy_loss
        self.clip_bounds = (loss.clip_ratio_low, loss.clip_ratio_high)
        d = cfg.distillation
        self.distillation_loss_mode = d.loss_mode if d.enabled else None
        self.tokenizer = tokenizer
        self.describe_reward = reward_source_describer(cfg)
        self.writer = TraceWriter(
            run_dir,
            fraction=t.fraction,
            max_trajectories_per_step=t.max_trajectories_per_step,
            max_total_mb=t.max_total_mb,
            seed=cfg.trainer.seed,
        )
        self.current: StepTrace | None = None

    def _decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids))

    def begin(self, step: int) -> None:
        self.current = StepTrace(step, traced=set()) if self.enabled else None

    def adopt(self, trace: StepTrace | None) -> None:
        """The step's rollout and reward rows, traced where its batch was collected (maybe by the
        producer thread, on its own copy of this tracer)."""
        if self.enabled:
            self.current = trace

    def after_rollout(self, batch: DataProto, sampling: SamplingParams, seed: int | None) -> None:
        """Q1-Q6, from the rows generate wrote (each generation round of the step adds its rows)."""
        if self.current is None:
            return
        ids = fields.trajectory_ids(batch)
        uids = [str(u) for u in batch["uid"]]
        chosen = self.writer.traced_ids(self.current.step, uids, ids)
        self.current.traced |= set(ids) if chosen is None else chosen
        seeds = [None if seed is None else seed + i for i in range(len(batch))]  # row i samples seed + i
        columns = fields.source_fields(batch, self._decode)
        columns |= fields.expansion_fields(batch, self.n)
        params = dataclasses.asdict(sampling)
        columns |= fields.generation_fields(batch, sampling=params, seeds=seeds, decode=self._decode)
        columns |= fields.interaction_fields(batch) | fields.mask_fields(batch)
        self.current.add(ids, columns)

    def after_reward(self, batch: DataProto, result: RewardResult | None) -> None:
        """Q7; `result` is the reward phase's (None when the agent scored while generating)."""
        if self.current is None:
            return
        sources = [self.describe_reward(str(d)) for d in batch["data_source"]]
        extras = result.extra if result is not None else None
        messages = result.sample_messages if result is not None else None
        columns = fields.reward_fields(batch, sources=sources, extras=extras, failure_messages=messages)
        self.current.add(fields.trajectory_ids(batch), columns)

    def after_estimator(self, batch: DataProto, hyperparameters: Mapping[str, Any]) -> None:
        """Q8's statistics, right after the advantage phase (before any resampling of its rows):
        what the estimator computed each advantage from, by the estimator's own `statistics` on the
        inputs and hyper-parameters `phases.advantage` gave it."""
        if self.current is None:
            return
        entry = get_advantage_estimator(self.estimator)
        inputs = {
            "token_level_rewards": batch["token_level_rewards"],
            "response_mask": batch["response_mask"],
            "group": group_ids_from_uids(batch["uid"]),
        }
        statistics = entry.explain(inputs, **entry.accepted(hyperparameters)) if entry.statistics else None
        self.current.add(fields.trajectory_ids(batch), fields.estimator_fields(statistics, len(batch)))

    def after_advantage(self, batch: DataProto) -> None:
        """Q8 and the log-prob half of Q9, on the rows that will be trained."""
        if self.current is None:
            return
        columns = fields.advantage_fields(batch, self.estimator) | fields.log_prob_fields(batch)
        self.current.add(fields.trajectory_ids(batch), columns)

    def after_update(
        self, batch: DataProto, row_stats: dict[str, torch.Tensor], trained_version: int
    ) -> None:
        """Q9 from the update's own forward (and π_old again: the update's forward may have written
        it, `pi_old.FromUpdate`), and Q10: the version the update started from."""
        if self.current is None:
            return
        ids = fields.trajectory_ids(batch)
        self.current.add(ids, fields.log_prob_fields(batch))
        lengths = fields.response_lengths(batch)
        trained_ids, columns = fields.update_fields(ids, row_stats, self.clip_bounds, lengths)
        if self.distillation_loss_mode is not None:
            columns["distillation_loss_mode"] = [self.distillation_loss_mode] * len(trained_ids)
        self.current.add(trained_ids, columns)
        self.current.add(ids, fields.closure_fields(batch, trained_version))

    @contextmanager
    def written_on_failure(self) -> Iterator[None]:
        """When the step fails (an error, a watchdog timeout), its trace so far is still written: the
        trajectories that were in flight when it hung."""
        try:
            yield
        except BaseException:
            self.end()
            raise

    def end(self) -> Path | None:
        """Write the step's trace; the path, or None when nothing was traced."""
        if self.current is None:
            return None
        trace, self.current = self.current, None
        return self.writer.write(trace)


def step_diagnostics(batch: DataProto, trained_version: int | None) -> dict[str, float]:
    """Metrics the doctor reads that no phase computes: the staleness of the trained trajectories
    (`rollout/staleness/{mean,max}`: trained version − generating version) and, when the batch has
    both, the `rollout_corr/*` diagnostics of π_old against π_rollout (the log-prob mismatch)."""
    metrics: dict[str, float] = {}
    if trained_version is not None:
        staleness = (trained_version - batch["weight_version"]).float()
        metrics |= {
            "rollout/staleness/mean": staleness.mean().item(),
            "rollout/staleness/max": staleness.max().item(),
        }
    mask = batch["response_mask"]
    if "old_log_probs" in batch and "rollout_log_probs" in batch and mask.any():
        metrics |= rollout_corr_metrics(batch["old_log_probs"], batch["rollout_log_probs"], mask)
    return metrics
