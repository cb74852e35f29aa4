"""Layer 2, control flow: supervised warm-start (SFT) on the same prompt datasets.

Each example is a prompt (chat-templated, left-padded) followed by its reference response
(`extra_info["answer"]`, verl's SFT convention) and EOS, right-padded: the same layout as an RL
batch, so the same worker and engine train it. The loss is the token-mean negative log-likelihood
of the response tokens only:  L = −Σ_t m_t log π(y_t | x, y_<t) / Σ_t m_t.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from stratarl.algo.aggregation import aggregate_loss
from stratarl.algo.groups import share_of_groups_with_signal
from stratarl.assembly import datasets, preflight, roles
from stratarl.cluster.handles import PolicyHandle, UpdateRequest
from stratarl.cluster.specs import ActorSpec, BatchingSpec, OptimizerSettings, PolicySpec
from stratarl.cluster.worker_group import PolicyWorkerGroup
from stratarl.config import RunConfig
from stratarl.data.prompt_dataset import PromptDataset, PromptItem
from stratarl.data.sampler import PromptSampler
from stratarl.observe.loggers import make_sinks
from stratarl.observe.phase_monitor import PhaseMonitor
from stratarl.observe.plots import plot_sft
from stratarl.observe.progress import StepProgress
from stratarl.observe.run_log import RunLog, write_atomically
from stratarl.observe.stack_dumps import write_error_report
from stratarl.run_directory.claim import RunClaim, claim_run_directory
from stratarl.run_directory.lock import RunLock
from stratarl.run_directory.run_summary import SFT_RESULT, read_sft_result
from stratarl.trainer.interruption import RunInterrupted, StopRequest, StopRequested, stopped_line
from stratarl.trainer.validation import evaluate_accuracy, record_validation
from stratarl.transport.batch_edge import lay_out_batch_edge
from stratarl.transport.data_proto import DataProto

MODEL_COLUMNS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")


def sft_loss(micro: DataProto, scores, totals) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-mean NLL over the mini-batch (micro-batch losses add up to it)."""
    loss = aggregate_loss(
        -scores.log_prob, micro["response_mask"], "token-mean", global_num_tokens=totals.num_tokens
    )
    return loss, {"sft/loss": loss.item()}


sft_loss.needs_entropy = False  # type: ignore[attr-defined]


def reference_response(item: Any) -> str:
    answer = (item.extra_info or {}).get("answer")
    if not isinstance(answer, str) or not answer:
        raise ValueError(
            f"{item.source_file} row {item.source_row}: SFT needs extra_info['answer'] (reference)"
        )
    return answer


def sft_batch(dataset: PromptDataset, indices: list[int], tokenizer: Any) -> DataProto:
    """Prompt ++ reference response ++ EOS, in the batch-edge layout."""
    items = [dataset[i] for i in indices]
    eos = tokenizer.eos_token_id
    targets = [[*tokenizer.encode(reference_response(it), add_special_tokens=False), eos] for it in items]
    return sft_examples(items, targets, tokenizer.pad_token_id)


def sft_examples(
    items: Sequence[PromptItem], targets: list[list[int]], pad_token_id: int, *, masks: list | None = None
) -> DataProto:
    """Each item's prompt ++ its target ids, in the batch-edge layout at the batch's widths; `masks`
    (per target token, 1 = trained) become response_mask, all ones by default."""
    prompt_ids = [list(it.prompt_ids) for it in items]
    columns = lay_out_batch_edge(
        prompt_ids,
        targets,
        pad_token_id=pad_token_id,
        prompt_len=max(len(p) for p in prompt_ids),
        response_len=max(len(t) for t in targets),
        action_mask=masks,
    )
    return DataProto.from_dict({k: columns[k] for k in MODEL_COLUMNS})


def sft_worker(cfg: RunConfig, tokenizer: Any, total_steps: int) -> PolicyWorkerGroup:
    """The policy of the RL run (model, device, precision, rollout engine) with the sft.* optimizer
    and micro-batching: no reference and no LoRA; log-probs at temperature 1 (the NLL). Built from
    those parts alone, so SFT reads no actor.* setting but actor.fsdp (`SFT_READS`)."""
    s = cfg.sft
    optimizer = OptimizerSettings(
        lr=s.lr,
        weight_decay=s.weight_decay,
        grad_clip=s.grad_clip,
        lr_schedule=s.lr_schedule,
        warmup_steps=s.warmup_steps,
        total_steps=total_steps,
        min_lr_ratio=s.min_lr_ratio,
    )
    fsdp = cfg.actor.fsdp
    spec = PolicySpec(
        model=roles.model_spec(cfg, cfg.model.path),
        eos_token_ids=tuple(datasets.eos_token_ids(tokenizer)),
        pad_token_id=tokenizer.pad_token_id,
        actor=ActorSpec(optimizer, BatchingSpec(s.trajectories_per_micro_batch), temperature=1.0),
        rollout=roles.rollout_engine_spec(cfg, share_weights=roles.shares_weights(cfg, sft=True)),
        precision=roles.precision_spec(fsdp, offload_optimizer=fsdp.optimizer_offload),
    )
    return PolicyWorkerGroup.in_process(spec, threads=cfg.cluster.threads_per_worker)


def run_sft(
    worker: PolicyHandle,
    dataset: PromptDataset,
    tokenizer: Any,
    *,
    examples_per_step: int,
    total_steps: int,
    seed: int,
    log: RunLog,
    log_every: int = 10,
    make_batch: Callable[[PromptDataset, list[int], Any], DataProto] | None = None,
    max_tokens: int | None = None,
    stop: StopRequest | None = None,
    after_step: Callable[[int], bool] | None = None,
    monitor: PhaseMonitor | None = None,
) -> dict[str, float]:
    """`total_steps` optimizer steps of SFT; the rollout engine is synced at the end. `make_batch`
    lays out the examples (default `sft_batch`; multi-turn: `agent_sft.agent_sft_batch`). An example
    longer than `max_tokens` (sft.max_tokens) stops the run, naming it, before that step trains.
    `stop`: once Ctrl-C asked, StopRequested between two steps (after the last, the run completes).
    `after_step(step)`: called after each step but the last; True ends the run there (a plateau).
    `monitor`: names the phase an error leaves (`sft.update (step k)`, for run.json)."""
    monitor = monitor or PhaseMonitor()
    sampler = PromptSampler(len(dataset), batch_size=examples_per_step, seed=seed)
    metrics: dict[str, float] = {}
    with StepProgress(log.console, total=total_steps, label="sft") as progress:
        for step in range(1, total_steps + 1):
            if stop is not None:
                stop.check(step - 1)
            indices = sampler.next_batch()
            batch = (make_batch or sft_batch)(dataset, indices, tokenizer)
            _check_example_lengths(batch, dataset, indices, max_tokens, step)
            with monitor.phase("sft.update", step=step):
                metrics = worker.update_actor(batch, sft_loss, UpdateRequest(len(batch)))
            metrics = {k if k.startswith("sft/") else f"sft/{k}": v for k, v in metrics.items()}
            log.log_metrics(step, metrics, phase="sft")
            if step % log_every == 0 or step == total_steps:
                log.console.print(
                    f"[bold]sft step {step}/{total_steps}[/bold]  loss={metrics['sft/loss']:.4f}"
                )
            progress.advance(step)
            if step < total_steps and after_step is not None and after_step(step):
                log.console.print(f"[bold]sft stopped after step {step} of {total_steps}[/bold]")
                break
    worker.sync_weights()
    return metrics


@dataclass
class Plateau:
    """sft.stop_on_plateau: stop once `patience` held-out evaluations in a row fail to beat the best
    accuracy so far by `delta` (absolute). A gain smaller than `delta` neither counts as progress
    nor raises the best: a slow creep of 0.5 % per evaluation stops the run at delta 1 %."""

    patience: int
    delta: float
    best: float = -math.inf
    misses: int = 0

    def update(self, accuracy: float) -> bool:
        """Record one evaluation; True when the run should stop."""
        if accuracy >= self.best + self.delta:
            self.best, self.misses = accuracy, 0
        else:
            self.misses += 1
        return self.patience > 0 and self.misses >= self.patience


def _check_example_lengths(
    batch: DataProto, dataset: PromptDataset, indices: list[int], max_tokens: int | None, step: int
) -> None:
    lengths = batch["attention_mask"].sum(-1)
    if max_tokens is not None and int(lengths.max()) > max_tokens:
        item = dataset[indices[int(lengths.argmax())]]
        raise ValueError(
            f"sft.max_tokens={max_tokens}: {item.source_file} row {item.source_row} is "
            f"{int(lengths.max())} tokens as an SFT example (step {step}); raise sft.max_tokens"
        )


def sft_from_config(
    cfg: RunConfig, run_dir: str | Path, *, console: Console | None = None, stop: StopRequest | None = None
) -> dict[str, Any]:
    """`stratarl sft`: SFT on sft.train_files (empty: data.train_files) with the `sft` settings;
    greedy accuracy on data.val_files before and after; the result saved HF-loadable in
    run_dir/final, the summary in run_dir/summary.json. The run directory must be empty (or
    trainer.overwrite): SFT never resumes. The inputs are checked (`preflight`) before the model
    loads. With `stop` (the CLI's) Ctrl-C stops after the step that runs, marks the run interrupted
    and raises RunInterrupted (nothing is saved: SFT keeps no checkpoints). A run that dies of an
    exception is marked failed in run.json, with the error and the phase, as `stratarl train` is."""
    console, t = console or Console(), cfg.trainer
    with ExitStack() as cleanup:  # callbacks run last-registered first, each even if one fails
        lock = RunLock(run_dir).acquire()
        cleanup.callback(lock.release)
        compute_score = preflight.reward_function(cfg)
        tokenizer = datasets.load_tokenizer(cfg)
        train_key = preflight.sft_train_key(cfg)
        train_set = preflight.load_split(cfg, train_key, tokenizer)
        val_set = preflight.load_split(cfg, "data.val_files", tokenizer) if cfg.data.val_files else None
        preflight.check_sft_answers(train_set, train_key)
        preflight.check_sft_lengths(train_set, tokenizer, cfg.sft.max_tokens, train_key)
        preflight.check_data_sources(compute_score, {"data.val_files": val_set})
        claim = claim_run_directory(lock, cfg, total_steps=None, console=console, can_resume=False)
        cleanup.callback(claim.release)
        log = RunLog(claim.run_dir, console=console)
        claim.record_start(cfg, 0, None, console)
        sinks = make_sinks(
            t.logger, claim.run_dir, project=t.project_name, experiment=t.experiment_name, config=asdict(cfg)
        )
        log.attach(sinks)
        cleanup.callback(log.close)
        steps = sft_steps(cfg, len(train_set))
        if stop is not None:
            cleanup.enter_context(stop.armed(lambda: _stopped_at_once(claim, log, steps)))
        monitor = PhaseMonitor()
        try:
            return _sft_run(cfg, claim, log, tokenizer, train_set, val_set, steps, stop, monitor)
        except StopRequested as stopped:
            claim.record_interrupt(stopped.step)
            raise RunInterrupted(_stopped_line(stopped.step, steps)) from None
        except Exception as error:
            _record_failure(claim, error, monitor.failed_in)
            raise


def _record_failure(claim: RunClaim, error: Exception, phase: str | None) -> None:
    """The error in run.json (status failed) and in hang/error-*/ for `stratarl doctor`, as far as
    the disk allows (on a full or read-only one the error itself is what reaches the user)."""
    with suppress(OSError):
        write_error_report(claim.run_dir, error, phase)
    with suppress(OSError):
        claim.record_failure(error, phase=phase)


# `stratarl train` warns when the SFT run its model comes from leaves fewer groups than this with
# any reward difference (`share_of_groups_with_signal` at the held-out accuracy and rollout.n).
# Greedy held-out accuracy overstates what τ = 1 samples get right, so the line is generous.
LOW_SIGNAL_SHARE = 0.5


def sft_warm_start_warning(cfg: RunConfig) -> str | None:
    """A warning when model.path is the output of `stratarl sft` whose held-out accuracy leaves GRPO
    few groups with signal (too low, or too high); None otherwise (another model, or accuracy between)."""
    result = read_sft_result(cfg.model.path)
    accuracy = (result or {}).get("accuracy_after")
    if not isinstance(accuracy, int | float) or math.isnan(accuracy):
        return None
    n = cfg.rollout.n
    share = share_of_groups_with_signal(accuracy, n)
    if share >= LOW_SIGNAL_SHARE:
        return None
    return (
        f"model.path comes from an SFT run that scored {accuracy:.1%} held-out accuracy after "
        f"{result.get('steps')} steps: with rollout.n={n} about {share:.0%} of groups would have any "
        f"reward difference (1 − pⁿ − (1 − p)ⁿ), too few for GRPO to learn from; "
        + low_signal_remedy(accuracy)
    )


def low_signal_remedy(accuracy: float) -> str:
    """What to do when accuracy leaves few groups with signal: too low, more SFT; too high (most
    groups all right), more SFT only makes it fewer."""
    if accuracy < 0.5:
        return (
            "train SFT longer (sft.total_steps, or sft.test_freq with sft.stop_on_plateau) or raise rollout.n"
        )
    return (
        "most groups would be all right: GRPO has little left to learn on these prompts (harder "
        "prompts, or raise rollout.n); more SFT makes it fewer"
    )


def sft_steps(cfg: RunConfig, num_examples: int) -> int:
    """sft.total_steps, else sft.total_epochs passes over the examples."""
    s = cfg.sft
    return s.total_steps or s.total_epochs * max(1, num_examples // s.trajectories_per_step)


def _stopped_line(step: int, total: int) -> str:
    return stopped_line(step=step, total=total, saved=None, save_freq=0, resumable=False)


def _stopped_at_once(claim: RunClaim, log: RunLog, total: int) -> str:
    done = max((int(r["step"]) for r in log.history if r["phase"] == "sft"), default=0)
    claim.record_interrupt(done)
    return "stopped at once (second Ctrl-C), " + _stopped_line(done, total)


def _sft_run(
    cfg: RunConfig, claim: RunClaim, log: RunLog, tokenizer: Any, train_set: PromptDataset,
    val_set: PromptDataset | None, steps: int, stop: StopRequest | None, monitor: PhaseMonitor,
) -> dict[str, Any]:  # fmt: skip
    run_dir, start, s = claim.run_dir, time.perf_counter(), cfg.sft
    with monitor.phase("init"):
        worker = sft_worker(cfg, tokenizer, steps)
    accuracies: dict[int, float] = {}  # step -> held-out accuracy

    def accuracy(step: int) -> float:
        """Held-out accuracy at `step`: its metrics into metrics.jsonl, its generations into
        val_generations/step_<k>.jsonl, its core metrics on the console."""
        if val_set is None:
            return float("nan")
        with monitor.phase("validation", step=step):
            value, metrics, records = evaluate_accuracy(worker, cfg, tokenizer, val_set, step)
        # An untrained model never emits EOS: warn about cut responses after training only.
        record_validation(log, step, metrics, records, cfg.rollout.max_response_tokens, warn=step > 0)
        accuracies[step] = value
        return value

    plateau = Plateau(s.stop_on_plateau, s.plateau_delta)
    stopped_at: list[int] = []  # the step of a plateau stop

    def after_step(step: int) -> bool:
        if not (s.test_freq and step % s.test_freq == 0):
            return False
        # The engine must serve this step's weights: a shared engine's cached prompt KV is still
        # the last sync's (the random init's), and a held-out evaluation on it measures that model.
        worker.sync_weights()
        if plateau.update(accuracy(step)):
            stopped_at.append(step)
        return bool(stopped_at)

    before = accuracy(0)
    plateau.update(before)
    run_sft(
        worker, train_set, tokenizer, examples_per_step=s.trajectories_per_step, total_steps=steps,
        seed=cfg.trainer.seed, log=log, max_tokens=s.max_tokens, stop=stop, after_step=after_step,
        monitor=monitor,
    )  # fmt: skip
    stopped_early = bool(stopped_at)
    done = stopped_at[0] if stopped_early else steps
    after = accuracies[done] if done in accuracies else accuracy(done)
    final = (run_dir / "final").absolute()
    with monitor.phase("save"):
        worker.save_pretrained(final)
        tokenizer.save_pretrained(final)
    claim.record_finish(done)
    summary = {
        "accuracy_before": before,
        "accuracy_after": after,
        "steps": done,
        "planned_steps": steps,
        "stopped_on_plateau": stopped_early,
        "accuracy_by_step": {str(k): v for k, v in sorted(accuracies.items())},
        "validation_samples": len(val_set) * cfg.rollout.val_kwargs.n if val_set is not None else 0,
        "wall_time_s": round(time.perf_counter() - start, 1),
        "run_dir": str(run_dir.absolute()),
        "weights": str(final),
    }
    write_atomically(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    # beside the weights, so that `stratarl train` on this model knows how it was warm-started
    write_atomically(final / SFT_RESULT, json.dumps(summary, indent=2) + "\n")
    plot_sft(log.history, run_dir / "curves.png")
    (run_dir / "plots").mkdir(exist_ok=True)
    plot_sft(log.history, run_dir / "plots" / "sft.png")
    log.print_table("sft summary", {k: v for k, v in summary.items() if k != "accuracy_by_step"})
    return summary
