"""Layer 2, control flow: the RL trainer — `fit()` runs steps, each as docs/design.md#one-step reads.

    prompts -> expand to n -> generate -> reward -> old log-prob -> (ref log-prob)
            -> advantage -> actor update -> weight sync

Every phase is a function in `phases`, run under `observe.PhaseMonitor` (timed under verl's
`timing_s/<phase>` names, its memory peak, its watchdog deadline) and followed by the trace fields
it knows (`tracing.StepTracer`). The run directory receives the resolved config, where the roles
run (placement.json), metrics.jsonl, trajectories.jsonl, traces/ (`stratarl trace`), validation
generations, the final HF-loadable weights and PNGs of the run's curves (`stratarl plot`); hang/
when a deadline passed.
"""

from __future__ import annotations

import time
from contextlib import ExitStack, suppress
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console
from rich.markup import escape
from transformers import AutoConfig

from stratarl.assembly import algorithm, datasets, preflight, roles, run_watch, scoring
from stratarl.cluster.run_checkpoint import RunCheckpoint
from stratarl.config import BatchPlan, RunConfig, validate_config
from stratarl.data.sampler import PromptSampler
from stratarl.observe.loggers import make_sinks
from stratarl.observe.phase_monitor import PhaseMonitor
from stratarl.observe.progress import StepProgress
from stratarl.observe.run_log import RunLog
from stratarl.observe.stack_dumps import write_error_report
from stratarl.run_directory import checkpointing
from stratarl.run_directory.claim import claim_run_directory
from stratarl.run_directory.lock import RunLock
from stratarl.run_directory.run_summary import finish_run, write_placement
from stratarl.trainer import agent_rollout, gateway_rollout, interruption, phases, pi_old, training_modes
from stratarl.trainer.agent_validation import run_agent_validation
from stratarl.trainer.batch_sources import BatchSource
from stratarl.trainer.correction import build_correction
from stratarl.trainer.interruption import RunInterrupted, StopRequest, StopRequested
from stratarl.trainer.sft import sft_warm_start_warning
from stratarl.trainer.step import RewardKL, RLStep, SingleTurn
from stratarl.trainer.step_settings import StepSettings
from stratarl.trainer.tracing import StepTracer
from stratarl.trainer.validation import record_validation, run_validation

DROPPED_ROWS = "dropped_rows.jsonl"  # in the run directory: one line per row loading left out


class RLTrainer:
    """RL training of one policy (GRPO family, PPO with GAE and a critic), in one process or on Ray."""

    def __init__(self, cfg: RunConfig, run_dir: str | Path, *, console: Console | None = None):
        warnings = validate_config(cfg)
        if (warm_start := sft_warm_start_warning(cfg)) is not None:
            warnings.append(warm_start)
        datasets.seed_everything(cfg.trainer.seed)
        self.cfg = cfg
        lock = RunLock(run_dir).acquire()  # a second writer is refused before anything loads
        try:
            self._set_up(cfg, lock, console or Console(), warnings)
        except BaseException:
            lock.release()
            raise

    def _set_up(self, cfg: RunConfig, lock: RunLock, console: Console, warnings: list[str]) -> None:
        for warning in warnings:  # settings that run but are probably unintended (validation.py)
            console.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)
        self.compute_score = preflight.reward_function(cfg)  # its file and name, before any data loads
        self.tokenizer = datasets.load_tokenizer(cfg)
        d = cfg.data
        self.train_set = preflight.load_split(cfg, "data.train_files", self.tokenizer)
        self.val_set = preflight.load_split(cfg, "data.val_files", self.tokenizer) if d.val_files else None
        preflight.check_data_sources(
            self.compute_score, {"data.train_files": self.train_set, "data.val_files": self.val_set}
        )
        preflight.check_teacher_sources(cfg, self.train_set)  # each row's teacher (distillation.teachers)
        if cfg.agent.enable:  # each row's agent loop (agent_name) must exist
            agent_rollout.check_agent_names(self.train_set, self.val_set)
        preflight.check_prompts_per_step(cfg, self.train_set)
        data_seed = d.seed if d.seed is not None else cfg.trainer.seed
        self.sampler = PromptSampler(
            len(self.train_set), batch_size=d.prompts_per_step, seed=data_seed, shuffle=d.shuffle
        )
        self.total_steps = (
            cfg.trainer.total_steps or cfg.trainer.total_epochs * self.sampler.batches_per_epoch
        )
        # The run directory: continue the run there, begin one, or refuse (run_directory docstring).
        self.claim = claim_run_directory(lock, cfg, total_steps=self.total_steps, console=console)
        try:
            self._build(cfg, console)
        except BaseException:
            self.claim.release()
            raise

    def _build(self, cfg: RunConfig, console: Console) -> None:
        self.log = RunLog(self.claim.run_dir, console=console, print_steps="console" in cfg.trainer.logger)
        self.run_dir = self.log.run_dir
        self.settings = StepSettings.from_config(cfg)
        self.kl_ctrl = algorithm.build_kl_controller(cfg)  # None unless KL is in the reward
        model_config = AutoConfig.from_pretrained(
            cfg.model.path, trust_remote_code=cfg.model.trust_remote_code
        )
        self.pi_old = pi_old.choose_old_log_probs(  # where π_old comes from (`pi_old` docstring)
            cfg,
            model_has_dropout=pi_old.has_dropout(model_config),
            estimator_inputs=self.settings.estimator_inputs,
        )
        self.actor_loss = algorithm.build_actor_loss(cfg, old_log_prob_from_forward=self.pi_old.from_update)
        self.value_loss = algorithm.build_value_loss(cfg)
        self.correction = build_correction(cfg)
        self.plan = BatchPlan.from_config(cfg)
        self.tracer = StepTracer(cfg, self.tokenizer, self.run_dir)
        self.watchdog = run_watch.build_watchdog(cfg, self.run_dir)  # None: watchdog.enable=false
        self.monitor = PhaseMonitor(self.watchdog, roles=run_watch.PHASE_ROLES)
        # agent.enable: multi-turn episodes with tools in generate and validation; None: one turn
        self.agent = agent_rollout.build_agent_rollout(cfg, self.tokenizer)
        # agent.gateway.enable: the user's agent program through the OpenAI-compatible gateway instead
        self.agent = self.agent or gateway_rollout.build_gateway_rollout(cfg, self.tokenizer)
        # Last, so that nothing after them can fail and leave processes behind: the policy, for PPO
        # the critic (the actor waits critic.warmup_training_steps steps), then the reward's workers
        # (a reward model's Ray actor joins the policy's cluster).
        self.worker = self.critic = self.rewards = None
        try:
            self.worker, self.critic = roles.build_workers(cfg, self.tokenizer, total_steps=self.total_steps)
            self.rewards = scoring.build_reward(cfg, policy=self.worker)
        except BaseException:
            self.stop_processes()
            raise
        self.step = RLStep(
            self.settings,
            self.train_set,
            self.sampler,
            self.tokenizer,
            self.worker,
            self.critic,
            self.rewards,
            actor_loss=self.actor_loss,
            value_loss=self.value_loss,
            pi_old=self.pi_old,
            monitor=self.monitor,
            tracer=self.tracer,
            version_of=self.version_of,
            rollout=self.agent or SingleTurn(),
            correction=self.correction,
            reward_kl=RewardKL(self.kl_ctrl, cfg.algorithm.kl_penalty),
            console=self.log.console,
        )
        self.checkpoints = RunCheckpoint(
            self.run_dir / checkpointing.CHECKPOINT_DIR,
            policy=self.worker,
            critic=self.critic,
            max_to_keep=cfg.trainer.max_checkpoints_to_keep,
            lineage=self.claim.run_id,
        )
        self.last_val: dict[str, float] = {}
        # The policy version step k trains is k + version_offset (one version per step; the
        # rollout may serve an older one between pushes, trainer.mode=async).
        self.version_offset = self.worker.weight_version - 1
        self.batches: BatchSource | None = None  # built once the start step is known (`_fit`)
        self.resumed_batches: dict[str, Any] | None = None
        self.stop = StopRequest()  # never requested unless `fit` is given one to arm (the CLI's)
        self.last_done = 0  # the last step completed in this process (or the resumed one)

    def version_of(self, step: int) -> int:
        return step + self.version_offset

    # ------------------------------------------------------------------------------------------
    def fit(self, *, stop: StopRequest | None = None) -> dict[str, Any]:
        """Train up to `total_steps` (continuing from a checkpoint when trainer.resume_mode finds one);
        returns the last validation metrics (empty without a val set). Worker processes (Ray) are
        stopped at the end, also when a step fails, and so are the scoring and tool workers and the
        metric sinks (TensorBoard, W&B). With `stop` (the CLI's) Ctrl-C stops the run after the step
        that runs, saved where trainer.save_freq allows, and raises `RunInterrupted` (`interruption`)."""
        with ExitStack() as cleanup:  # callbacks run last-registered first, each even if one fails
            if stop is not None:  # disarmed last: a second Ctrl-C during the clean-up still exits at once
                self.stop = cleanup.enter_context(stop.armed(self._stopped_at_once))
            cleanup.callback(self.claim.release)  # last: the run directory is free once all stopped
            if self.watchdog is not None:  # stopped next to last: a cleanup that hangs still meets its grace
                self.watchdog.start()
                cleanup.callback(self.watchdog.stop)
            cleanup.callback(self.log.close)
            cleanup.callback(self.stop_processes)
            if self.watchdog is not None:  # every worker process can dump its stacks from now on
                workers = run_watch.watched_workers(self.worker, self.critic, self.rewards)
                run_watch.watch_workers(self.watchdog, self.run_dir, workers)
            try:
                return self._fit()
            except Exception as error:
                self._record_failure(error)
                raise

    def _record_failure(self, error: Exception) -> None:
        """The error, for `stratarl doctor` (hang/error-*/; a watchdog timeout wrote its own report)
        and in run.json (status failed). Each as far as the disk allows: on a full or read-only one
        neither is written, and the error itself is what reaches the user."""
        with suppress(OSError):
            write_error_report(self.run_dir, error, self.monitor.failed_in)
        with suppress(OSError):
            self.claim.record_failure(error, phase=self.monitor.failed_in)

    def close(self) -> None:
        """Without training: stop every process the trainer started and release the run directory
        (`fit` does both when it ends)."""
        try:
            self.stop_processes()
        finally:
            self.claim.release()

    def stop_processes(self) -> None:
        """Stop every process the trainer started, each even if another fails: the scoring and tool
        workers first (a reward model's Ray actor lives in the policy's cluster), then the critic's
        ranks, then the policy's (whose shutdown may end the Ray cluster)."""
        with ExitStack() as cleanup:  # last registered, first run
            if self.worker is not None:
                cleanup.callback(self.worker.shutdown)
            if self.critic is not None:
                cleanup.callback(self.critic.shutdown)
            if self.agent is not None:
                cleanup.callback(self.agent.close)
            if self.rewards is not None:
                cleanup.callback(self.rewards.close)

    def _fit(self) -> dict[str, Any]:
        self.log.console.print(self.plan.render())
        self.log.console.print(f"[dim]{self.pi_old.line}[/dim]")
        write_placement(self.run_dir, self.worker, self.critic)
        start, run_start = self.resume(), time.perf_counter()
        self.last_done = start
        self.data_counts = self.record_datasets(start)
        self.batches = training_modes.build_batch_source(
            self.cfg,
            self.step,
            self.worker,
            self.monitor,
            total_steps=self.total_steps,
            version_of=self.version_of,
            first_step=start + 1,
        )
        if self.resumed_batches is not None:
            self.batches.load_state_dict(self.resumed_batches)
        try:
            return self._train_from(start, run_start)
        finally:
            self.batches.close()

    def _train_from(self, start: int, run_start: float) -> dict[str, Any]:
        t = self.cfg.trainer
        self.log.attach(
            make_sinks(
                t.logger,
                self.run_dir,
                project=t.project_name,
                experiment=t.experiment_name,
                config=asdict(self.cfg),
                resumed_after=start or None,
            )
        )
        last_val: dict[str, float] = self.last_val
        if (
            start == 0
            and self.val_set is not None
            and (self.cfg.trainer.val_before_train or self.cfg.trainer.val_only)
        ):
            last_val = self.validate(step=0)
        self.last_val = last_val
        if self.cfg.trainer.val_only:
            self.claim.record_finish(start)
            return last_val
        try:
            self._run_steps(start)
        except StopRequested as stopped:  # Ctrl-C
            self._stop_after(stopped.step, can_save=stopped.can_save)
        finish_run(
            self.log,
            self.worker,
            self.tokenizer,
            checkpoints=self.checkpoints.root if self.checkpoints.steps() else None,
            last_val=self.last_val,
            start=start,
            total_steps=self.total_steps,
            seconds=time.perf_counter() - run_start,
        )
        self.claim.record_finish(self.total_steps)
        return self.last_val

    def _run_steps(self, start: int) -> None:
        """Steps start+1..total_steps, each logged, then validated and saved where due; after Ctrl-C
        the loop stops between two steps (StopRequested)."""
        with StepProgress(self.log.console, total=self.total_steps, start=start) as progress:
            for step in range(start + 1, self.total_steps + 1):
                self.stop.check(step - 1)
                try:
                    metrics = self.train_step(step)
                except Exception:
                    if not self.stop.requested:
                        raise
                    # failed after Ctrl-C (a process that took the signal too): nothing of it is kept
                    raise StopRequested(step - 1, can_save=False) from None
                if step == 1:  # so that readers of train records see the data counts too
                    metrics = {**self.data_counts, **metrics}
                self.log.log_metrics(step, metrics)
                self.log.print_step(step, self.total_steps, metrics)
                progress.advance(step)
                self.last_done = step
                with self.batches.paused(step):  # the producer (if any) generates nothing meanwhile
                    if self.validates(step):
                        self.last_val = self.validate(step)
                    if checkpointing.should_save(step, self.total_steps, self.cfg.trainer.save_freq):
                        self.save_checkpoint(step)
            self.stop.check(self.total_steps)

    def _stop_after(self, step: int, *, can_save: bool) -> NoReturn:
        """Ctrl-C: the run stops after `step`, saved where trainer.save_freq allows checkpoints (and the
        weights pushed first where trainer.mode=async had not), marked interrupted; one line."""
        if can_save and self.cfg.trainer.save_freq > 0 and step > self.claim.record["steps_done"]:
            if self.worker.weight_version != self.version_of(step) + 1:
                self.batches.push_weights(step, self.version_of(step) + 1, {}, force=True)
            with self.batches.paused(step):
                self.save_checkpoint(step)
        raise RunInterrupted(self._record_interrupt(step))

    def _stopped_at_once(self) -> str:
        """A second Ctrl-C (the process exits next): mark the run; the line names the newest checkpoint."""
        return "stopped at once (second Ctrl-C), " + self._record_interrupt(self.last_done)

    def _record_interrupt(self, step: int) -> str:
        self.claim.record_interrupt(step)
        done = self.claim.record["steps_done"]  # as of the newest checkpoint
        path = self.checkpoints.root / f"global_step_{done}"
        saved = (done, path.absolute()) if done > 0 and path.is_dir() else None
        return interruption.stopped_line(
            step=step, total=self.total_steps, saved=saved, save_freq=self.cfg.trainer.save_freq
        )

    def record_datasets(self, step: int) -> dict[str, float]:
        """What loading left out, before the first step of this start: a console line per split, every
        dropped row with its reason in dropped_rows.jsonl, and at step 0 the `data/*` counts
        (`data/val/*` for the validation set) in metrics.jsonl (phase "data"; a resumed run keeps
        that record, so its metrics stay those of a run never stopped); returns the counts."""
        splits = {"train": (self.train_set, "data"), "val": (self.val_set, "data/val")}
        metrics = {"data/prompts_unused_per_epoch": float(self.sampler.unused_per_epoch)}
        dropped: list[dict[str, Any]] = []
        for split, (dataset, prefix) in splits.items():
            if dataset is None:
                continue
            metrics |= dataset.metrics(prefix)
            dropped += [row.record(split) for row in dataset.report.dropped]
            style = "yellow" if dataset.report.num_dropped else "dim"
            self.log.console.print(f"[{style}]{split} data: {escape(dataset.report.start_line())}[/{style}]")
        path = self.run_dir / DROPPED_ROWS
        if dropped:
            self.log.write_jsonl(path, dropped)
            self.log.console.print(f"[dim]dropped rows and their reasons: {path}[/dim]")
        else:
            path.unlink(missing_ok=True)  # a previous start's list no longer holds
        if not self.cfg.data.shuffle and self.sampler.unused_per_epoch:
            self.log.console.print(
                f"[yellow]the last {self.sampler.unused_per_epoch} prompts of the file never train: "
                "data.shuffle=false and they do not fill a batch of data.prompts_per_step[/yellow]"
            )
        if step == 0:
            self.log.log_metrics(step, metrics, phase="data")
        return metrics

    def validates(self, step: int) -> bool:
        freq = self.cfg.trainer.test_freq
        return self.val_set is not None and freq > 0 and (step % freq == 0 or step == self.total_steps)

    # --- checkpoint and resume -------------------------------------------------------------------
    def save_checkpoint(self, step: int) -> None:
        """Everything a resume needs (`checkpointing` module docstring), written atomically."""
        state = checkpointing.trainer_state(
            step,
            sampler=self.sampler,
            kl_ctrl=self.kl_ctrl,
            worker=self.worker,
            version_offset=self.version_offset,
            batches=self.batches,
            last_val=self.last_val,
        )
        with self.monitor.phase("save", step=step):
            path = self.checkpoints.save(step, tokenizer=self.tokenizer, trainer_state=state)
        self.claim.record_checkpoint(step)
        self.log.console.print(f"[dim]checkpoint: {path}[/dim]")

    def resume(self) -> int:
        """Restore the checkpoint the run directory's claim accepted (the newest complete one, or
        trainer.resume_from_path); returns the step to continue after. The start is recorded
        (config.yaml, run.json) only once that succeeded."""
        point = checkpointing.accepted_resume_point(self.claim, self.checkpoints)
        if point is not None:  # before the start is recorded: a refused resume changes nothing
            checkpointing.check_sampler(point, self.sampler, train_files=self.cfg.data.train_files)
        if self.claim.cut_first_save:  # starts again at step 0: the lost steps' records go
            self.log.history = checkpointing.truncate_logs(self.run_dir, -1)
            self.tracer.writer.truncate_after(0)
        self.claim.record_start(
            self.cfg, point.step if point else 0, point.path if point else None, self.log.console
        )
        if point is None:
            return 0
        restored = checkpointing.restore_trainer_state(
            point, sampler=self.sampler, kl_ctrl=self.kl_ctrl, worker=self.worker
        )
        self.version_offset, self.resumed_batches = restored.version_offset, restored.batches
        self.last_val = restored.last_val
        self.log.history = checkpointing.truncate_logs(self.run_dir, point.step)
        self.tracer.writer.truncate_after(point.step)
        self.log.console.print(restored.message)
        return point.step

    def train_step(self, step: int) -> dict[str, float]:
        """One step (`step.RLStep.run`), its weights pushed every step or as trainer.mode says, and
        always before a validation, a checkpoint or a Ctrl-C stop (the weights it saves are the
        rollout's: never one left asleep or stale, a verl bug)."""
        due = (
            self.validates(step)
            or checkpointing.should_save(step, self.total_steps, self.cfg.trainer.save_freq)
            or self.stop.requested  # a Ctrl-C checkpoint follows this step
        )
        batch, metrics = self.step.run(step, self.batches, sync_due=due)
        if self.cfg.rollout.max_replica_restarts > 0:
            metrics = metrics | self.record_replica_restarts(step)
        if self.cfg.trainer.save_trajectories:
            texts = phases.decode_responses(self.tokenizer, batch)
            prompt_texts = [self.tokenizer.decode(ids) for ids in batch["raw_prompt_ids"]]
            records = phases.trajectory_records(batch, texts, prompt_texts, step)
            self.log.log_trajectories(agent_rollout.with_agent_records(records, batch))
        return metrics

    def record_replica_restarts(self, step: int) -> dict[str, float]:
        """Rollout replicas restarted since the last step (rollout.max_replica_restarts), each on the
        console and in run.json (`replica_restarts`: step, replica, cause, why); their count this step
        and in this process so far (`rollout/replica_restarts`, `rollout/replica_restarts_total`).
        A restart during the validation after step k is counted in step k + 1."""
        restarts = self.worker.take_replica_restarts()
        limit = self.cfg.rollout.max_replica_restarts
        for r in restarts:
            self.log.console.print(
                f"[yellow]step {step}: rollout replica {r.replica_id} {escape(r.why)}; started again "
                f"(restart {r.number} of {limit}) in {r.seconds:.1f} s, serving weight version "
                f"{r.weight_version}[/yellow]",
                soft_wrap=True,
            )
            with suppress(OSError):
                self.claim.record_replica_restart(step, asdict(r))
        return {
            "rollout/replica_restarts": float(len(restarts)),
            "rollout/replica_restarts_total": float(self.worker.replica_restarts_used),
        }

    def validate(self, step: int) -> dict[str, float]:
        assert self.val_set is not None
        v = self.cfg.rollout.val_kwargs
        run = run_validation if self.agent is None else partial(run_agent_validation, self.agent)
        if isinstance(self.agent, gateway_rollout.GatewayRollout):
            run = partial(gateway_rollout.run_gateway_validation, self.agent)
        with self.monitor.phase("val", step=step, rows=len(self.val_set)):
            metrics, records = run(
                self.worker,
                self.val_set,
                tokenizer=self.tokenizer,
                compute_score=self.rewards,  # the run's reward sources, workers and deadlines included
                sampling=algorithm.val_sampling(self.cfg),
                n=v.n,
                step=step,
                seed=self.settings.step_seed(step) + 7,
            )
        self.worker.clear_queue(through=step)  # its rows; not those of batches collected ahead
        record_validation(self.log, step, metrics, records, self.cfg.rollout.max_response_tokens)
        return metrics
