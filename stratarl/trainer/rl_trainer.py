"""Layer 2, control flow: the RL trainer — `fit()` runs steps, each step reads like DESIGN.md §3.

    prompts -> expand to n -> generate -> reward -> old log-prob -> (ref log-prob)
            -> advantage -> actor update -> weight sync

Every phase is a function in `phases`, timed under verl's `timing_s/<phase>` names. The run
directory receives the resolved config, metrics.jsonl, trajectories.jsonl, validation generations,
the final HF-loadable weights and a PNG of the learning curves.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import Progress, TimeElapsedColumn

from stratarl.algo.aggregation import aggregate_loss
from stratarl.algo.groups import group_ids_from_uids
from stratarl.algo.kl_control import make_kl_controller
from stratarl.config import BatchPlan, RunConfig, save_resolved_config, validate_config
from stratarl.data.sampler import PromptSampler
from stratarl.observe.data_metrics import data_metrics, group_signal_share, throughput_metrics
from stratarl.observe.plots import plot_learning_curves
from stratarl.observe.run_log import RunLog
from stratarl.observe.timing import timed, timing_metrics
from stratarl.trainer import builders, phases, sampling_phases
from stratarl.trainer.validation import run_validation
from stratarl.transport.data_proto import DataProto

LOW_SIGNAL_SHARE = 0.1  # warn when fewer groups than this carry any reward variance


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def sum_reward_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """Reward metrics of several generation rounds: failure counts add up, means are averaged."""
    keys = {key for part in parts for key in part}
    return {
        key: (sum if key.startswith("reward/failures/") else _mean)([p[key] for p in parts if key in p])
        for key in keys
    }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


class RLTrainer:
    """GRPO-family training of one policy, in one process (the in-process cluster backend)."""

    def __init__(self, cfg: RunConfig, run_dir: str | Path, *, console: Console | None = None):
        validate_config(cfg)
        seed_everything(cfg.trainer.seed)
        self.cfg = cfg
        self.log = RunLog(run_dir, console=console)
        self.run_dir = self.log.run_dir
        self.tokenizer = builders.load_tokenizer(cfg)
        d = cfg.data
        self.train_set = builders.load_prompts(
            d.train_files, self.tokenizer, max_prompt_tokens=d.max_prompt_tokens, limit=d.max_train_prompts
        )
        self.val_set = (
            builders.load_prompts(
                d.val_files, self.tokenizer, max_prompt_tokens=d.max_prompt_tokens, limit=d.max_val_prompts
            )
            if d.val_files
            else None
        )
        data_seed = d.seed if d.seed is not None else cfg.trainer.seed
        self.sampler = PromptSampler(
            len(self.train_set), batch_size=d.prompts_per_step, seed=data_seed, shuffle=d.shuffle
        )
        self.total_steps = (
            cfg.trainer.total_steps or cfg.trainer.total_epochs * self.sampler.batches_per_epoch
        )
        self.worker = builders.build_policy_worker(cfg, self.tokenizer, total_steps=self.total_steps)
        self.loss_fn = builders.build_actor_loss(cfg)
        a = cfg.algorithm
        self.kl_ctrl = (
            make_kl_controller(
                a.kl_ctrl.type,
                kl_coef=a.kl_ctrl.kl_coef,
                target_kl=a.kl_ctrl.target_kl,
                horizon=a.kl_ctrl.horizon,
            )
            if a.use_kl_in_reward
            else None
        )
        self.compute_score = builders.build_compute_score(cfg)
        self.sampling = builders.train_sampling(cfg)
        self.plan = BatchPlan.from_config(cfg)

    # ------------------------------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        """Train for `total_steps`; returns the last validation metrics (empty without a val set)."""
        self.log.console.print(self.plan.render())
        save_resolved_config(self.cfg, self.run_dir)
        last_val: dict[str, float] = {}
        if (self.cfg.trainer.val_before_train or self.cfg.trainer.val_only) and self.val_set is not None:
            last_val = self.validate(step=0)
        if self.cfg.trainer.val_only:
            return last_val
        columns = (*Progress.get_default_columns(), TimeElapsedColumn())
        with Progress(*columns, console=self.log.console, transient=True) as progress:
            bar = progress.add_task("training", total=self.total_steps)
            for step in range(1, self.total_steps + 1):
                metrics = self.train_step(step)
                self.log.log_metrics(step, metrics)
                self.log.print_step(step, self.total_steps, metrics)
                progress.advance(bar)
                freq = self.cfg.trainer.test_freq
                if self.val_set is not None and freq > 0 and (step % freq == 0 or step == self.total_steps):
                    last_val = self.validate(step)
        self.worker.save_pretrained(self.run_dir / "final")
        self.tokenizer.save_pretrained(self.run_dir / "final")
        plot_learning_curves(self.log.history, self.run_dir / "curves.png")
        return last_val

    def train_step(self, step: int) -> dict[str, float]:
        cfg, timings = self.cfg, {}
        with timed("step", timings):
            batch, collect_metrics = self._collect(step, timings)
            batch, prepare_metrics = self._prepare(batch, timings)
            with timed("update_actor", timings):
                actor_metrics = phases.update_actor(
                    self.worker,
                    batch,
                    self.loss_fn,
                    mini_batch_size=min(cfg.actor.prompts_per_mini_batch * cfg.rollout.n, len(batch)),
                    epochs=cfg.actor.ppo_epochs,
                    seed=self._seed(step) if cfg.actor.shuffle else None,
                )
            with timed("update_weights", timings):
                sync_metrics = phases.sync_weights(self.worker)
        if self.kl_ctrl is not None:
            current_kl = prepare_metrics.get("actor/reward_kl_penalty", 0.0)
            self.kl_ctrl.update(current_kl, n_steps=len(batch) // cfg.rollout.n)
        metrics = self._step_metrics(
            batch, timings, collect_metrics, prepare_metrics, actor_metrics, sync_metrics
        )
        if cfg.trainer.save_trajectories:
            texts = phases.decode_responses(self.tokenizer, batch)
            prompt_texts = [self.tokenizer.decode(ids) for ids in batch["raw_prompt_ids"]]
            self.log.log_trajectories(phases.trajectory_records(batch, texts, prompt_texts, step))
        return metrics

    def _collect(self, step: int, timings: dict[str, float]) -> tuple[DataProto, dict[str, float]]:
        """Rollout and reward for B prompts × n; with DAPO's dynamic sampling, rounds of them until B
        prompts whose groups carry signal are kept (or the round cap is hit)."""
        cfg, n = self.cfg, self.cfg.rollout.n
        filtering = cfg.algorithm.filter_groups
        target, kept, reward_parts, dropped, rounds = cfg.data.prompts_per_step * n, [], [], 0, 0
        while True:
            rounds += 1
            prompts = builders.prompts_batch(
                self.train_set, self.sampler.next_batch(), self.tokenizer.pad_token_id
            )
            batch = phases.expand_prompts(prompts, n, f"{step}.{rounds}")
            with timed("gen", timings):
                batch = phases.generate(
                    self.worker, batch, self.sampling, seed=self._seed(step) + 7919 * rounds
                )
            if cfg.algorithm.adv_estimator == "remax":
                with timed("gen_max", timings):
                    batch = sampling_phases.greedy_baselines(
                        self.worker, batch, n, self.sampling, self._score
                    )
            with timed("reward", timings):
                batch, result, _ = phases.reward(batch, self.tokenizer, self.compute_score)
            reward_parts.append(result.metrics())
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
        metrics = sum_reward_metrics(reward_parts)
        metrics |= {"batch/gen_rounds": float(rounds), "batch/dropped_groups": float(dropped)}
        return batch.take(torch.arange(usable)), metrics

    def _score(self, batch: DataProto) -> DataProto:
        return phases.reward(batch, self.tokenizer, self.compute_score)[0]

    def _prepare(self, batch: DataProto, timings: dict[str, float]) -> tuple[DataProto, dict[str, float]]:
        """Old and reference log-probs, rollout correction, then advantages."""
        cfg, metrics = self.cfg, {}
        correction = cfg.algorithm.rollout_correction
        if correction.bypass_mode:
            batch = sampling_phases.use_rollout_log_probs(batch)
        else:
            with timed("old_log_prob", timings):
                batch = phases.old_log_prob(self.worker, batch)
        if cfg.uses_reference:
            with timed("ref", timings):
                batch = phases.ref_log_prob(self.worker, batch)
        with timed("adv", timings):
            if not correction.bypass_mode and (correction.rollout_is or correction.rollout_rs):
                batch, metrics = sampling_phases.apply_decoupled_correction(
                    batch, builders.rollout_correction_settings(cfg)
                )
            batch, adv_metrics = phases.advantage(
                batch,
                estimator=cfg.algorithm.adv_estimator,
                hyperparameters=builders.advantage_hyperparameters(cfg),
                kl_in_reward=(self.kl_ctrl.value, cfg.algorithm.kl_penalty) if self.kl_ctrl else None,
                component_keys=cfg.algorithm.gdpo_reward_keys,
            )
        return batch, metrics | adv_metrics

    def _step_metrics(self, batch, timings, *parts: dict[str, float]) -> dict[str, float]:
        mask = batch["response_mask"]
        metrics: dict[str, float] = {"training/global_step": float(len(self.log.history) + 1)}
        for part in parts:
            metrics |= part
        metrics |= data_metrics(batch)
        if "entropys" in batch:  # bypass mode runs no actor forward before the update
            metrics["actor/entropy"] = aggregate_loss(
                batch["entropys"], mask, self.cfg.actor.loss_agg_mode
            ).item()
        share = group_signal_share(batch["token_level_scores"].sum(-1), group_ids_from_uids(batch["uid"]))
        metrics["batch/groups_with_signal"] = share
        if share < LOW_SIGNAL_SHARE:
            self.log.console.print(
                f"[yellow]warning: only {share:.0%} of groups have any reward variance; group-relative "
                "advantages are 0 for the rest, so the policy barely moves (reward too sparse or too easy?)"
            )
        n_response = int(mask.sum())
        metrics |= timing_metrics(timings, n_response, int(batch["attention_mask"].sum()))
        metrics |= throughput_metrics(batch, timings["step"])
        return metrics

    def _seed(self, step: int) -> int:
        return self.cfg.trainer.seed * 1_000_003 + step * 10_007

    def validate(self, step: int) -> dict[str, float]:
        assert self.val_set is not None
        v = self.cfg.rollout.val_kwargs
        metrics, records = run_validation(
            self.worker,
            self.val_set,
            tokenizer=self.tokenizer,
            compute_score=self.compute_score,
            sampling=builders.val_sampling(self.cfg),
            n=v.n,
            step=step,
            seed=self._seed(step) + 7,
        )
        self.log.log_metrics(step, metrics, phase="val")
        (self.run_dir / "val_generations").mkdir(exist_ok=True)
        RunLog.write_jsonl(self.run_dir / "val_generations" / f"step_{step}.jsonl", records)
        core = {k: v for k, v in metrics.items() if k.startswith("val-core/")}
        self.log.console.print(f"[bold cyan]validation @ step {step}[/bold cyan] {core}")
        return metrics
