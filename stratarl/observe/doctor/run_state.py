"""Cross-cutting: is the run alive, how far did it get, and what may a rerun do — read from the run
directory's own records for `stratarl doctor`.

    run.lock     {"pid", "host", "since"} of the process writing the run, emptied when it lets go;
                 the writer holds a kernel lock (flock) on the directory for its life
                 (`run_directory/lock.py`): held = live; a holder named but not holding it died
    run.json     status (running | finished | interrupted | failed, with the error), steps done
                 as of the newest checkpoint
    checkpoints/global_step_N/   what a rerun with trainer.resume_mode=auto continues from

Liveness comes from the directory's lock, not from how recently metrics.jsonl was written: a run killed
mid-step is named at once, and a slow step of a live run is not mistaken for a dead one. A holder on
another host cannot be checked from here; then the age of metrics.jsonl is all there is.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from stratarl.observe.doctor.view import COMPUTE, LIVE_WITHIN_S, Finding, RunView

CHECKPOINT_DIR = "checkpoints"


def checkpoint_steps(run_dir: Path) -> list[int]:
    """The steps of checkpoints/global_step_N, oldest first (what a resume can continue from)."""
    root = run_dir / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    names = [p.name.removeprefix("global_step_") for p in root.glob("global_step_*") if p.is_dir()]
    return sorted(int(n) for n in names if n.isdigit())


def holder_state(view: RunView) -> str:
    """'none' (nobody holds the lock nor is named), 'alive' (a process holds the directory's lock),
    'dead' (run.lock names a holder on this host that no longer holds the lock), or 'elsewhere'
    (named on another host: cannot be checked from here). Where the lock cannot be probed (the
    directory cannot be opened), the named pid decides."""
    holder = view.lock
    if view.lock_held:
        return "alive"
    if not holder or "pid" not in holder:
        return "none"
    if holder.get("host") != socket.gethostname():
        return "elsewhere"
    if view.lock_held is False:
        return "dead"
    try:
        os.kill(int(holder["pid"]), 0)
    except (ProcessLookupError, ValueError, TypeError):
        return "dead"
    except PermissionError:  # exists, owned by another user
        return "alive"
    return "alive"


def _holder_name(view: RunView) -> str:
    return f"pid {view.lock['pid']}" if view.lock and "pid" in view.lock else "a process"


def is_finished(view: RunView) -> bool:
    return (view.run_dir / "final").is_dir() or (view.record or {}).get("status") == "finished"


def is_live(view: RunView) -> bool:
    """A process holds the run directory's lock; a holder on another host, or a directory whose lock
    cannot be probed: metrics.jsonl written recently."""
    state = holder_state(view)
    if state in ("alive", "dead"):
        return state == "alive"
    if state == "none" and view.lock_held is False:
        return False  # nobody holds the lock nor is named: no writer on this host
    return view.modified_s_ago is not None and view.modified_s_ago < LIVE_WITHIN_S and not is_finished(view)


def resume_advice(view: RunView) -> str:
    """What a rerun of the same command does in this directory, from what it holds."""
    steps = checkpoint_steps(view.run_dir)
    mode = view.setting("trainer.resume_mode") or "auto"
    if steps and mode in ("auto", "resume_path"):
        return (
            f"run the same command again: it resumes from {CHECKPOINT_DIR}/global_step_{steps[-1]} "
            f"(step {steps[-1]} done) and repeats the steps after it"
        )
    if steps:
        return (
            f"run it again with trainer.resume_mode=auto to resume from {CHECKPOINT_DIR}/"
            f"global_step_{steps[-1]} (now trainer.resume_mode={mode})"
        )
    return (
        f"there is no checkpoint to resume from (trainer.save_freq={view.setting('trainer.save_freq')}), so "
        "the same command is refused in this directory: start over with trainer.overwrite=true (moves "
        "this run aside) or another trainer.experiment_name, and set trainer.save_freq > 0 to keep progress"
    )


def run_status(view: RunView) -> str:
    sft = [r for r in view.records if r.get("phase") == "sft"] if not view.train else []
    steps = [int(r["step"]) for r in (sft or view.train)]
    total = view.setting("sft.total_steps" if sft else "trainer.total_steps")
    of = f" of {total}" if total else ""
    done = (
        f"{'SFT ' if sft else ''}steps {min(steps)}..{max(steps)}{of}"
        if steps
        else "no training step logged yet"
    )
    if not steps and total:
        done += f" (total {total})"
    state = holder_state(view)
    if is_finished(view):
        how = "finished"
    elif state == "alive":
        how = f"live ({_holder_name(view)} holds the run directory's lock)"
    elif state == "dead":
        how = f"dead (pid {view.lock['pid']}, named in run.lock, no longer holds the lock)"
    elif (view.record or {}).get("status") == "interrupted":
        how = f"interrupted after step {view.record.get('interrupted_after')}"
    elif (view.record or {}).get("status") == "failed":
        how = f"failed ({view.record.get('error')})"
    elif is_live(view):
        how = "live (written to in the last 2 minutes)"
    else:
        how = "not finished"
    return f"{done}, {how}"


def check_progress(view: RunView, earlier: list[Finding]) -> list[Finding]:
    """A run that stopped before its last step without a recorded reason (killed from outside): a
    problem at once when its lock holder is gone, a warning when only the age of the metrics says so."""
    steps = [int(r["step"]) for r in view.train]
    total = view.setting("trainer.total_steps")
    state = holder_state(view)
    if is_finished(view) or is_live(view) or (view.record or {}).get("status") == "interrupted":
        return []
    if state != "dead" and (not steps or not total or max(steps) >= total):
        return []
    if any(f.key in ("hang", "error") for f in earlier):
        return []  # the hang or error report says why
    last = f"after step {max(steps)}" if steps else "before its first step"
    evidence = []
    if state == "dead":
        holder = view.lock
        evidence.append(
            f"run.lock names pid {holder['pid']} on {holder.get('host')} (since {holder.get('since')}); "
            "it no longer holds the run directory's lock: it died without releasing it (a clean stop "
            "empties run.lock)"
        )
    if view.record:
        evidence.append(
            f"run.json status {view.record.get('status')!r}, steps_done {view.record.get('steps_done')}"
        )
    if view.modified_s_ago is not None:
        evidence.append(
            f"metrics.jsonl last written {view.modified_s_ago:.0f} s ago; no hang report in hang/"
        )
    return [
        Finding(
            "problem" if state == "dead" else "warning",
            COMPUTE,
            f"the run {'is dead: it ' if state == 'dead' else ''}stopped {last}"
            + (f" of {total}" if total else "")
            + " and recorded no error",
            evidence,
            "the process was killed from outside (the kernel's out-of-memory killer: `dmesg`; a scheduler's "
            f"time limit) or its error went to the console only; {resume_advice(view)}",
            key="progress",
        )
    ]
