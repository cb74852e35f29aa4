"""Run directory, beside layer 2: save a run and resume it exactly where it stopped.

What one checkpoint holds (`engine.checkpoint.CheckpointManager` writes it atomically):

    actor/, critic/        model, optimizer and LR-schedule states of each trained role
    rng/                   python, numpy and torch RNG states
    huggingface/           the policy, loadable with from_pretrained
    trainer_state.pt       global step, sampler position (epoch, batch in epoch), KL controller,
                           rollout weight version and version offset, the batches collected
                           ahead (trainer.mode), last validation metrics (`trainer_state`)

A resumed run reloads all of it, pushes the actor's weights into the rollout engine under the saved
weight version, and cuts the run directory's logs back to the checkpoint's step, so metrics.jsonl
reads as if the run had never stopped. Every random choice of a step is seeded from (seed, step) or
restored from the checkpoint, so steps after a resume repeat the uninterrupted run's steps exactly.

Departure from verl: verl's fit loop iterates epochs and then the dataloader; a resume exactly at
an epoch boundary restored an exhausted dataloader and trained 0 steps (verl #7401). Here the loop
runs over global steps and the sampler rolls over to the next epoch itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stratarl.cluster.run_checkpoint import RunCheckpoint
from stratarl.observe.run_log import replace_atomically
from stratarl.run_directory.claim import RunClaim
from stratarl.run_directory.lock import RunDirectoryError

CHECKPOINT_DIR = "checkpoints"
LOG_FILES = ("metrics.jsonl", "trajectories.jsonl")


@dataclass
class ResumePoint:
    step: int  # the last completed step; training continues at step + 1
    path: Path
    trainer_state: dict[str, Any]


@dataclass
class Restored:
    """What a resume hands back to the trainer (the sampler, KL controller and rollout are restored)."""

    version_offset: int  # the policy version step k trains is k + version_offset
    batches: dict[str, Any] | None  # the batch source's state: batches collected ahead
    last_val: dict[str, float]
    message: str  # the console line saying where the run continues


def trainer_state(step: int, *, sampler, kl_ctrl, worker, version_offset: int, batches, last_val) -> dict:
    """The trainer's part of the checkpoint of `step` (`batches`: the batch source, whose state
    holds what it collected ahead, read back from the TransferQueue)."""
    return {
        "global_step": step,
        "sampler": sampler.state_dict(),
        "kl_ctrl": kl_ctrl.state_dict() if kl_ctrl else None,
        "weight_version": worker.weight_version,
        "version_offset": version_offset,
        "batches": batches.state_dict(worker.materialize),
        "last_val": last_val,
    }


def restore_trainer_state(point: ResumePoint, *, sampler, kl_ctrl, worker) -> Restored:
    """Put the sampler, the KL controller and the rollout's weights (pushed under the saved
    version) back where `point` left them."""
    state = point.trainer_state
    sampler.load_state_dict(state["sampler"])
    if kl_ctrl is not None:
        kl_ctrl.load_state_dict(state["kl_ctrl"])
    worker.sync_weights(version=state["weight_version"])
    # Checkpoints of before trainer.mode: one version per step, all pushed, nothing collected ahead.
    offset = state.get("version_offset", state["weight_version"] - point.step - 1)
    batches = state.get("batches")
    ahead, position = len(batches["ready"]) if batches else 0, state["sampler"]
    message = (
        f"[bold green]resumed[/bold green] from {point.path}: step {point.step} done, continuing at "
        f"step {point.step + 1} (epoch {position['epoch']}, batch {position['batch_in_epoch']}"
        + (f"; {ahead} batch(es) collected ahead, restored)" if ahead else ")")
    )
    return Restored(offset, batches, state["last_val"], message)


def check_sampler(point: ResumePoint, sampler, *, train_files: list[str]) -> None:
    """The checkpoint's sampler must describe this one (the same prompts, batches, seed, order), or
    the resumed run would visit other prompts than the run it continues: refused, naming the files."""
    saved = point.trainer_state["sampler"]
    if saved["num_items"] != sampler.num_items:
        raise RunDirectoryError(
            f"cannot resume from {point.path}: its run drew prompts from {saved['num_items']} training "
            f"rows, and data.train_files ({', '.join(map(str, train_files))}) now gives "
            f"{sampler.num_items} (after data.max_train_prompts and the rows loading drops): the file "
            "was rewritten, and resuming would visit other prompts. Restore the file, or start a "
            "separate run (trainer.experiment_name=<new name>, or trainer.overwrite=true)"
        )
    for key in ("batch_size", "seed", "shuffle", "drop_last"):
        if saved[key] != getattr(sampler, key):
            raise RunDirectoryError(
                f"cannot resume from {point.path}: its prompt sampler had {key}={saved[key]!r}, this "
                f"config gives {getattr(sampler, key)!r}; resuming would visit other prompts"
            )


def should_save(step: int, total_steps: int, save_freq: int) -> bool:
    """Every `save_freq` steps and at the last step; never when save_freq ≤ 0."""
    return save_freq > 0 and (step % save_freq == 0 or step == total_steps)


def load_resume_point(checkpoint: RunCheckpoint, *, mode: str, resume_from_path: str) -> ResumePoint | None:
    """Restore the workers and the RNG states from the checkpoint `mode` selects; None to start fresh.

    auto: the newest complete checkpoint under <run_dir>/checkpoints (incomplete or corrupted ones are
    skipped with a warning naming the one used); disable: none; resume_path: that global_step_N dir.
    """
    if mode == "disable":
        return None
    loaded = checkpoint.load(directory=resume_from_path if mode == "resume_path" else None)
    if loaded is None:
        return None
    if loaded.trainer_state is None:
        raise ValueError(f"checkpoint {loaded.path} has no trainer_state.pt: it was not saved by a trainer")
    return ResumePoint(step=loaded.step, path=loaded.path, trainer_state=loaded.trainer_state)


def accepted_resume_point(claim: RunClaim, checkpoint: RunCheckpoint) -> ResumePoint | None:
    """The checkpoint the run directory's claim accepted, restored (the newest complete one, or
    trainer.resume_from_path); None for a new run. A claim to resume that finds no complete
    checkpoint, or one of another run, is refused rather than started afresh over the old logs."""
    if not claim.resume:
        return None
    mode = "resume_path" if claim.resume_from else "auto"
    point = load_resume_point(checkpoint, mode=mode, resume_from_path=claim.resume_from)
    if point is None:
        raise RunDirectoryError(
            f"{checkpoint.root} holds no complete checkpoint to resume from (see the warnings above); "
            "choose another trainer.experiment_name, or trainer.overwrite=true"
        )
    claim.check_lineage(point.path, point.trainer_state.get("lineage"))
    return point


def truncate_logs(run_dir: Path, step: int) -> list[dict[str, Any]]:
    """Drop the records of steps after `step` (written before the run stopped, after its last
    checkpoint) from the run's JSONL logs; returns the kept metrics records.

    Each log is streamed into a file beside it and renamed over it (`replace_atomically`): a kill
    at any moment of the rewrite leaves the whole old log or the whole new one, never a part (the
    old `write_text` truncated a 150 MB log to 0 bytes when killed while writing)."""
    kept_metrics: list[dict[str, Any]] = []
    for name in LOG_FILES:
        path = run_dir / name
        if not path.is_file():
            continue
        with path.open() as source, replace_atomically(path) as out:
            for line in source:
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:  # a line cut short by the kill
                    continue
                if int(record.get("step", 0)) <= step:
                    out.write(line if line.endswith("\n") else line + "\n")
                    if name == "metrics.jsonl":
                        kept_metrics.append(record)
    return kept_metrics
