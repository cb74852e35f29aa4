"""Cross-cutting: Python stack dumps of the run's processes, for a hang — faulthandler and py-spy.

A rank process (a Ray actor) *arms* itself once: `faulthandler.register` on SIGUSR1 writes the
stacks of all its threads to its own file in the run's hang folder. faulthandler's handler runs in
C, so it dumps even while the process's main thread is stuck in a collective or a kernel and no
Python code can run there. The controller then *triggers* a dump with `os.kill(pid, SIGUSR1)` (a
process on this node) and, where `py-spy` is installed, adds `py-spy dump --pid` (native frames,
every thread, from outside the process).
"""

from __future__ import annotations

import faulthandler
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

DUMP_SIGNAL = signal.SIGUSR1
HANG_DIR = "hang"
BUSY = "no answer yet"  # in a process's dump line: its last call had not returned (it is what hangs)
_ARMED: dict[int, IO[str]] = {}  # signal -> the open file faulthandler writes to (kept open)
FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def main_thread_frames(text: str, depth: int = 4) -> list[str]:
    """The innermost `depth` frames of the main thread in faulthandler output — the one thread that
    threading did not start (every other thread's outermost frame is threading's _bootstrap); of the
    last dump when the text holds several; [] if none."""
    blocks = re.split(r"\n(?=(?:Current )?[Tt]hread 0x)", "\n" + text)
    frames = [[m.group(0) for m in FRAME.finditer(block)] for block in blocks]
    main = [f for f in frames if f and not any("in _bootstrap" in frame for frame in f)]
    return main[-1][:depth] if main else []


def stack_file_name(role: str, rank: int, pid: int) -> str:
    return f"stacks-{role}-rank{rank}-pid{pid}.txt"


def arm_stack_dumps(folder: str | Path, role: str, rank: int) -> dict[str, object]:
    """In a rank process: SIGUSR1 from now on appends every thread's stack to
    `folder/stacks-<role>-rank<r>-pid<pid>.txt`. Returns {pid, path} for the controller."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / stack_file_name(role, rank, os.getpid())
    previous = _ARMED.pop(DUMP_SIGNAL, None)
    out = path.open("a", encoding="utf-8")
    faulthandler.register(DUMP_SIGNAL, file=out, all_threads=True, chain=False)
    if previous is not None:
        previous.close()
    _ARMED[DUMP_SIGNAL] = out
    return {"pid": os.getpid(), "path": str(path)}


def trigger_stack_dump(pid: int, path: str | Path, header: str) -> tuple[str, int | None]:
    """Ask process `pid` (armed with `arm_stack_dumps`) to append its stacks to `path` under a
    header line. Returns what happened (for the hang report) and the file's size after the header
    (None when the process could not be signalled): the dump is what is written past it."""
    path = Path(path)
    try:
        with path.open("a", encoding="utf-8") as f:
            f.write(f"\n===== {header} ({time.strftime('%Y-%m-%d %H:%M:%S')}) =====\n")
        size = path.stat().st_size
        os.kill(pid, DUMP_SIGNAL)
    except ProcessLookupError:
        return f"pid {pid}: no such process on this node (it died, or runs on another node)", None
    except OSError as error:
        return f"pid {pid}: could not signal ({error})", None
    return f"pid {pid}: stacks appended to {path}", size


def wait_for_dump(path: str | Path, size_before: int, timeout_s: float = 3.0) -> bool:
    """True once `path` grew past `size_before` (the dump was written), False after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    path = Path(path)
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size > size_before:
            time.sleep(0.2)  # let faulthandler finish the other threads
            return True
        time.sleep(0.05)
    return False


def py_spy_dump(pid: int, out_path: str | Path, timeout_s: float = 20.0) -> str | None:
    """`py-spy dump --pid` into `out_path` when py-spy is installed (None otherwise); what happened."""
    exe = shutil.which("py-spy")
    if exe is None:
        return None
    try:
        done = subprocess.run(
            [exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return f"pid {pid}: py-spy dump did not finish within {timeout_s:g} s"
    Path(out_path).write_text(done.stdout + done.stderr, encoding="utf-8")
    status = "written" if done.returncode == 0 else f"failed (exit {done.returncode})"
    return f"pid {pid}: py-spy dump {status}: {out_path}"


def dump_this_process(path: str | Path, header: str) -> Path:
    """This process's stacks, every thread, into `path` (faulthandler, so C-stuck threads show too)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(f"===== {header} ({time.strftime('%Y-%m-%d %H:%M:%S')}) =====\n")
        f.flush()
        faulthandler.dump_traceback(file=f, all_threads=True)
    return path


@dataclass(frozen=True)
class ArmedProcess:
    """A process armed with `arm_stack_dumps`: which role and rank it is, its pid and dump file."""

    role: str
    rank: int
    pid: int
    path: str

    @property
    def name(self) -> str:
        return f"{self.role} rank {self.rank}"


def dump_armed(
    processes: Sequence[ArmedProcess], folder: str | Path, header: str, notes: Mapping[int, str] | None = None
) -> list[str]:
    """Trigger every process's dump at once, wait for each, and copy what it wrote into `folder`
    (plus a `py-spy dump` where installed). Returns one line per process; `notes[rank]` (what the
    controller last asked of that rank) is added to its line."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    triggered = {p.pid: trigger_stack_dump(p.pid, p.path, header) for p in processes}  # all at once
    lines = {pid: line for pid, (line, _) in triggered.items()}
    for p in processes:
        size = triggered[p.pid][1]
        if size is None:
            continue
        target = folder / stack_file_name(p.role, p.rank, p.pid)
        if wait_for_dump(p.path, size):
            with Path(p.path).open("rb") as f:
                f.seek(size)
                target.write_bytes(f"===== {header} =====\n".encode() + f.read())
            lines[p.pid] = f"pid {p.pid}: stacks in {target}"
        else:
            lines[p.pid] = f"pid {p.pid}: signalled, but wrote no stacks within 3 s"
        spy = py_spy_dump(p.pid, folder / f"py-spy-{p.role}-rank{p.rank}-pid{p.pid}.txt")
        if spy is not None:
            lines[p.pid] += f"; {spy}"
    notes = notes or {}
    return [
        f"{p.name} ({notes[p.rank]}): {lines[p.pid]}" if p.rank in notes else f"{p.name}: {lines[p.pid]}"
        for p in processes
    ]


def write_error_report(run_dir: str | Path, error: BaseException, phase: str | None) -> Path:
    """`<run>/hang/error-<time>/report.json` for a run that stopped with an exception: its type,
    message, the phase it escaped from and its innermost frames (what `stratarl doctor` reads)."""
    import traceback

    folder = Path(run_dir) / HANG_DIR / f"error-{int(time.time())}"
    folder.mkdir(parents=True, exist_ok=True)
    frames = traceback.extract_tb(error.__traceback__)
    report = {
        "message": f"{type(error).__name__}: {error}",
        "exception": type(error).__name__,
        "phase": phase,
        "frames": [f'File "{f.filename}", line {f.lineno} in {f.name}' for f in reversed(frames)][:8],
    }
    (folder / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return folder
