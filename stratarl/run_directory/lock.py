"""Run directory, beside layer 2: `run.lock`, held by the one process that writes a run directory.

`RunLock` is taken before anything loads; `claim.claim_run_directory` then decides, holding it, what
the start may do in the directory. `RunDirectoryError` is how either refuses a start.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

LOCK_FILE = "run.lock"
HOST = socket.gethostname()


class RunDirectoryError(ValueError):
    """A start refused in its run directory (another writer, another run, a config that cannot
    resume); the message says why and what to do instead."""


def now() -> str:
    """The local time as run.lock and run.json record it."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


class RunLock:
    """`run.lock`: at most one process writes a run directory. The lock is an flock, which the
    kernel drops when its holder dies, so the lock of a killed run is taken over safely; the file
    names the holder (pid, host, since) for whoever is refused, and is emptied on release. A
    record left by a process on another host is not taken over: this host cannot tell whether it
    still runs."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None
        self.taken_over: dict[str, Any] | None = None  # the stale record replaced, if any

    def acquire(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunDirectoryError(
                f"{self.path.parent} is being written by {_describe(holder)} ({self.path}); a second "
                "writer would interleave its steps with that run's. Wait for it to finish or stop it, "
                "or start this one elsewhere (another trainer.experiment_name or trainer.run_dir)."
            ) from None
        previous = _read_holder(fd)
        if previous and previous.get("host") != HOST:
            os.close(fd)
            raise RunDirectoryError(
                f"{self.path} names {_describe(previous)}, on another host: it may still be running "
                f"there, which cannot be checked from {HOST}. If it is not, delete {self.path}."
            )
        self.taken_over = previous or None
        record = json.dumps({"pid": os.getpid(), "host": HOST, "since": now()})
        os.ftruncate(fd, 0)
        os.pwrite(fd, record.encode(), 0)
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)  # an empty lock file: nobody holds it
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None


def _read_holder(fd: int) -> dict[str, Any]:
    data = os.pread(fd, 4096, 0)
    try:
        holder = json.loads(data) if data.strip() else {}
    except json.JSONDecodeError:
        return {}
    return holder if isinstance(holder, dict) else {}


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "another process"
    return f"pid {holder.get('pid')} on host {holder.get('host')} (since {holder.get('since')})"
