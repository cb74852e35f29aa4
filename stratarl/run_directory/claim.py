"""Run directory, beside layer 2: what a start may do in its run directory, and the run's lineage.

    run.lock     names the process writing the run (pid, host); what it holds while it lives is
                 a kernel lock on the directory itself (`lock.RunLock`)
    run.json     the lineage: its id, status (running | finished | interrupted: stopped by
                 Ctrl-C at a safe point | failed: stopped by an exception, with the error), steps
                 done (as of the newest checkpoint or the end), and
                 one entry per start ("legs"): when, where, the command, from which checkpoint,
                 which settings changed
    config.yaml  the resolved config of the newest accepted start (written only once accepted)

`claim_run_directory` decides, before any worker starts, what a new start may do in its directory:
begin a run in an empty one, or continue (resume) the run that lives there when trainer.resume_mode
asks for it and the config changes pass `resume_rules`. Anything else — a finished run, a run with
no checkpoint to continue, files of another run, resume_mode=disable where a run lives — is
refused with the choices (resume, another experiment name, or trainer.overwrite=true, which moves
the old run aside to <run_dir>.old-<time>). One run's records are never appended to another's.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from stratarl.config import RunConfig, save_resolved_config
from stratarl.observe.run_log import write_atomically
from stratarl.run_directory.lock import HOST, LOCK_FILE, RunDirectoryError, RunLock, now
from stratarl.run_directory.resume_rules import Change, config_changes, review_changes

RECORD_FILE, CONFIG_FILE = "run.json", "config.yaml"
CHECKPOINT_DIR = "checkpoints"


def default_run_dir(cfg: RunConfig, *, suffix: str = "") -> Path:
    """trainer.run_dir, else <output_root>/<project_name>/<experiment_name><suffix> (`stratarl
    train` and, with suffix "-sft", `stratarl sft`): the same command finds the same run again."""
    t = cfg.trainer
    return (
        Path(t.run_dir)
        if t.run_dir
        else Path(t.output_root) / t.project_name / f"{t.experiment_name}{suffix}"
    )


def _pid_alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:
        return True
    return True


@dataclass
class RunClaim:
    """What a start may do in its run directory (`claim_run_directory`): continue the run that
    lives there (`resume`) or begin one; it holds the lock until `release`."""

    run_dir: Path
    lock: RunLock
    record: dict[str, Any]  # run.json as it will be written
    resume: bool = False
    resume_from: str = ""  # a checkpoint directory (resume_mode=resume_path), else "" (the newest)
    changes: dict[str, Change] = field(default_factory=dict)  # accepted changes of settings
    abandoned: list[Path] = field(default_factory=list)  # newer checkpoints a resume_path leaves behind
    cut_first_save: list[Path] = field(default_factory=list)  # what a run killed in its first save left

    @property
    def run_id(self) -> str:
        return self.record["run_id"]

    def record_start(
        self, cfg: RunConfig, start_step: int, checkpoint: Path | None, console: Console
    ) -> None:
        """The start is accepted (a checkpoint, if any, loaded): move abandoned checkpoints aside,
        write config.yaml and append this start to run.json's legs."""
        if self.abandoned:
            aside = self.run_dir / CHECKPOINT_DIR / f".abandoned-{time.strftime('%Y%m%d-%H%M%S')}"
            aside.mkdir(parents=True)
            for path in self.abandoned:
                os.replace(path, aside / path.name)
            console.print(
                f"[yellow]checkpoints after step {start_step} belong to the branch this resume leaves: "
                f"moved to {aside}[/yellow]",
                soft_wrap=True,
            )
        if self.cut_first_save:
            self._start_again(console)
        save_resolved_config(cfg, self.run_dir)
        leg = {
            "started": now(),
            "host": HOST,
            "pid": os.getpid(),
            "command": sys.argv,
            "start_step": start_step,
            "resumed_from": str(checkpoint) if checkpoint else None,
            "changes": {key: list(change) for key, change in self.changes.items()},
        }
        self.record["legs"].append(leg)
        for key in ("interrupted", "interrupted_after", "failed", "error", "failed_in"):  # an earlier leg's
            self.record.pop(key, None)
        self.record |= {"status": "running", "steps_done": start_step}
        self._write_record()
        if self.changes:
            shown = "; ".join(f"{key}: {old} → {new}" for key, (old, new) in self.changes.items())
            console.print(f"[yellow]resumed with changed settings[/yellow] {shown}", soft_wrap=True)

    def _start_again(self, console: Console) -> None:
        """The run was killed while saving its first checkpoint: nothing of it can be continued, so
        it starts again at step 0 in the same lineage; the partial save goes (the logs of the lost
        steps are cut by the trainer, as a resume cuts them back to its checkpoint)."""
        for path in self.cut_first_save:
            shutil.rmtree(path, ignore_errors=True)
        console.print(
            f"[yellow]{self.run_dir} holds a run killed while saving its first checkpoint "
            f"({', '.join(p.name for p in self.cut_first_save)}, incomplete): nothing to resume, so it "
            "starts again at step 0[/yellow]",
            soft_wrap=True,
        )

    def check_lineage(self, checkpoint: Path, lineage: str | None) -> None:
        """A checkpoint this run resumes from must be its own (unless the run is a fork of another)."""
        if "forked_from" in self.record or lineage in (None, self.run_id):
            return
        raise RunDirectoryError(
            f"checkpoint {checkpoint} was written by another run (lineage {lineage}; this run is "
            f"{self.run_id}): it was copied in from elsewhere. Resume it from its own run directory, or "
            "start from it with trainer.resume_mode=resume_path in a new one"
        )

    def record_checkpoint(self, step: int) -> None:
        """Steps done, as of the checkpoint just saved."""
        self.record["steps_done"] = step
        self._write_record()

    def record_interrupt(self, step: int) -> None:
        """Stopped by Ctrl-C after `step` (steps_done stays the newest checkpoint's): a start with
        trainer.resume_mode=auto continues it from that checkpoint."""
        self.record |= {"status": "interrupted", "interrupted": now(), "interrupted_after": step}
        self._write_record()

    def record_failure(self, error: BaseException, *, phase: str | None) -> None:
        """Stopped by an exception (steps_done stays the newest checkpoint's): its type, message and
        phase; a start with trainer.resume_mode=auto continues from that checkpoint."""
        message = f"{type(error).__name__}: {error}"
        self.record |= {"status": "failed", "failed": now(), "error": message[:2000], "failed_in": phase}
        self._write_record()

    def record_replica_restart(self, step: int, restart: Mapping[str, Any]) -> None:
        """A rollout replica started again during `step` (rollout.max_replica_restarts): which, why,
        when, kept in run.json's `replica_restarts` across legs."""
        self.record.setdefault("replica_restarts", []).append({"step": step, "at": now(), **restart})
        self._write_record()

    def record_finish(self, last_step: int) -> None:
        self.record |= {"status": "finished", "steps_done": last_step, "finished": now()}
        self._write_record()

    def _write_record(self) -> None:
        write_atomically(self.run_dir / RECORD_FILE, json.dumps(self.record, indent=1, default=str) + "\n")

    def release(self) -> None:
        self.lock.release()


def claim_run_directory(
    lock: RunLock, cfg: RunConfig, *, total_steps: int | None, console: Console, can_resume: bool = True
) -> RunClaim:
    """Decide what this start may do in `lock`'s directory (held), or raise RunDirectoryError with
    the choices. total_steps: the run's length; can_resume=False: a kind of run that never resumes
    (SFT). With trainer.overwrite the lock returned in the claim is a new one (the old moved aside)."""
    run_dir = lock.path.parent
    if lock.taken_over:
        pid = lock.taken_over.get("pid")
        alive = "running but not holding it" if _pid_alive(pid) else "no longer running"
        console.print(f"[dim]took over the stale lock of pid {pid} ({alive})[/dim]")
    if _holds_a_run(run_dir) and cfg.trainer.overwrite:
        lock = _move_aside(lock, console)
    try:
        if not _holds_a_run(run_dir):
            return _fresh_claim(run_dir, lock, cfg)
        return _continued_claim(run_dir, lock, cfg, total_steps=total_steps, can_resume=can_resume)
    except BaseException:
        lock.release()
        raise


def _continued_claim(
    run_dir: Path, lock: RunLock, cfg: RunConfig, *, total_steps: int | None, can_resume: bool
) -> RunClaim:
    """The run in `run_dir` continues (resume), or RunDirectoryError says why it cannot."""
    t, record = cfg.trainer, _read_record(run_dir)
    if record is None:
        why = "holds files but no readable run.json: not a run this start can continue"
        raise RunDirectoryError(_refusal(run_dir, why, resume=False))
    status = _status(record)
    if not can_resume:
        raise RunDirectoryError(_refusal(run_dir, f"holds a {status} run", resume=False))
    if t.resume_mode == "disable":
        why = f"holds a {status} run, and trainer.resume_mode=disable asks for a new one"
        raise RunDirectoryError(_refusal(run_dir, why, resume=True))
    steps = _checkpoint_steps(run_dir)
    claim = RunClaim(run_dir, lock, record, resume=True)
    if t.resume_mode == "resume_path":
        source = Path(t.resume_from_path).absolute()
        if source.parent != (run_dir / CHECKPOINT_DIR).absolute():
            why = f"holds a run of its own, and {source} is a checkpoint of another run"
            raise RunDirectoryError(_refusal(run_dir, why, resume=False))
        claim.resume_from = str(source)
        step = int(source.name.removeprefix("global_step_"))
        claim.abandoned = [run_dir / CHECKPOINT_DIR / f"global_step_{s}" for s in steps if s > step]
    elif not steps:
        cut = _cut_first_save(run_dir, record)
        if not cut:
            why = (
                f"holds a {status} run with no checkpoint to resume from (it ran with "
                f"trainer.save_freq={_saved_setting(run_dir, 'save_freq')})"
            )
            raise RunDirectoryError(_refusal(run_dir, why, resume=False))
        claim.resume, claim.cut_first_save = False, cut  # starts again at step 0 (`record_start`)
    last = record.get("steps_done", 0)
    finished = record.get("status") == "finished" and t.resume_mode == "auto"  # resume_path: a branch
    if finished and total_steps is not None and total_steps <= last:
        extend = (
            f"  - continue it: raise trainer.total_steps above {last} and add "
            "trainer.resume_allow_changes=[trainer.total_steps]"
        )
        raise RunDirectoryError(
            _refusal(run_dir, f"holds a finished run of {last} steps", resume=False, first=extend)
        )
    claim.changes = _reviewed_changes(run_dir, cfg, run_dir / CONFIG_FILE)
    return claim


def _status(record: dict[str, Any]) -> str:
    """A record's status as a start sees it (the lock was free, so a 'running' run has stopped)."""
    states = {
        "running": "stopped (unfinished)",
        "new": "never started",
        "interrupted": "interrupted (Ctrl-C)",
        "failed": "failed (an error stopped it)",
    }
    return states.get(record.get("status"), "finished")


def _fresh_claim(run_dir: Path, lock: RunLock, cfg: RunConfig) -> RunClaim:
    """A new lineage; with resume_mode=resume_path it starts from another run's checkpoint (a fork),
    checked against that run's config.yaml when there is one."""
    record = {
        "format": 1,
        "run_id": uuid.uuid4().hex,
        "created": now(),
        "status": "new",
        "steps_done": 0,
        "legs": [],
    }
    claim = RunClaim(run_dir, lock, record)
    if cfg.trainer.resume_mode == "resume_path":
        source = Path(cfg.trainer.resume_from_path).absolute()
        claim.resume, claim.resume_from = True, str(source)
        record["forked_from"] = str(source)
        saved = source.parent.parent / CONFIG_FILE
        if saved.is_file():
            claim.changes = _reviewed_changes(run_dir, cfg, saved)
    return claim


def _reviewed_changes(run_dir: Path, cfg: RunConfig, saved: Path) -> dict[str, Change]:
    if not saved.is_file():
        why = f"holds a run whose {CONFIG_FILE} is missing, so its settings cannot be compared"
        raise RunDirectoryError(_refusal(run_dir, why, resume=False))
    review = review_changes(config_changes(saved, cfg), cfg.trainer.resume_allow_changes)
    if review.refused:
        raise RunDirectoryError(
            f"cannot resume the run in {run_dir}: this config differs from the one it ran with "
            f"({saved}):\n{review.explain()}\n"
            + _choices(
                run_dir, resume=False, first="  - resume it: undo the changes, or allow the changeable ones"
            )
        )
    return review.accepted


def _saved_setting(run_dir: Path, name: str) -> Any:
    """trainer.<name> in the run's config.yaml ('?' when unreadable)."""
    try:
        return yaml.safe_load((run_dir / CONFIG_FILE).read_text())["trainer"][name]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return "?"


def _holds_a_run(run_dir: Path) -> bool:
    return run_dir.is_dir() and any(p.name not in (LOCK_FILE,) for p in run_dir.iterdir())


def _read_record(run_dir: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((run_dir / RECORD_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) and "run_id" in record else None


def _checkpoint_steps(run_dir: Path) -> list[int]:
    """Steps of the checkpoints that finished saving (a manifest), newest first (no hashing: the
    load verifies them)."""
    root = run_dir / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    names = (p.name for p in root.iterdir() if (p / "manifest.json").is_file())
    return sorted(
        (int(n.removeprefix("global_step_")) for n in names if n.startswith("global_step_")), reverse=True
    )


def _cut_first_save(run_dir: Path, record: dict[str, Any]) -> list[Path]:
    """The partial saves of a run killed while saving its first checkpoint ([] when it was not):
    no complete checkpoint, the run last recorded as running with no step saved, and nothing in
    checkpoints/ but the temporary and staging directories of saves that never finished."""
    root = run_dir / CHECKPOINT_DIR
    if record.get("status") != "running" or record.get("steps_done", 0) != 0 or not root.is_dir():
        return []
    entries = list(root.iterdir())
    partial = [
        p for p in entries if p.is_dir() and p.name.startswith((".tmp-global_step_", ".staged-global_step_"))
    ]
    return partial if partial and len(partial) == len(entries) else []


def _move_aside(lock: RunLock, console: Console) -> RunLock:
    """trainer.overwrite: rename the run directory to <name>.old-<time> (kept, not deleted) and lock
    a new, empty one in its place."""
    run_dir = lock.path.parent
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = run_dir.with_name(f"{run_dir.name}.old-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = run_dir.with_name(f"{run_dir.name}.old-{stamp}-{n}")
    os.rename(run_dir, aside)
    lock.release()  # it moved with the directory
    console.print(
        f"[yellow]trainer.overwrite: the run that was in {run_dir} is now in {aside}[/yellow]", soft_wrap=True
    )
    return RunLock(run_dir).acquire()


def _refusal(run_dir: Path, why: str, *, resume: bool, first: str = "") -> str:
    return f"refusing to start in {run_dir}: it {why}; a new start there would mix two runs.\n" + _choices(
        run_dir, resume=resume, first=first
    )


def _choices(run_dir: Path, *, resume: bool, first: str = "") -> str:
    lines = ["Choose one:"]
    if first:
        lines.append(first)
    if resume:
        lines.append("  - resume it: trainer.resume_mode=auto")
    lines.append(
        "  - start a separate run: trainer.experiment_name=<new name> (or trainer.run_dir=<new dir>)"
    )
    lines.append(f"  - replace it: trainer.overwrite=true (moves it to {run_dir.name}.old-<time> beside it)")
    return "\n".join(lines)
