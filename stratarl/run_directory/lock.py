"""Run directory, beside layer 2: the one process that writes a run directory holds a kernel lock
(flock) on the directory itself; `run.lock` in it names the holder.

`RunLock` is taken before anything loads; `claim.claim_run_directory` then decides, holding it, what
the start may do in the directory. `RunDirectoryError` is how either refuses a start.
"""

from __future__ import annotations

import errno
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
    """At most one process writes a run directory. The lock is an flock on an open descriptor of the
    directory itself, held for the run's life: the kernel drops it when its holder dies, so the lock
    of a killed run is taken over safely, and deleting or replacing `run.lock` (a file that only
    names the holder: pid, host, since; emptied on release) admits no second writer. A record left
    by a process on another host is not taken over: this host cannot tell whether it still runs."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / LOCK_FILE
        self._dir_fd: int | None = None
        self.taken_over: dict[str, Any] | None = None  # the stale record replaced, if any

    def acquire(self) -> RunLock:
        run_dir = self.path.parent
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            dir_fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as err:
            raise _unwritable(run_dir, err) from None
        if not _try_flock(dir_fd, fcntl.LOCK_EX):
            holder = read_holder(self.path)
            os.close(dir_fd)
            raise RunDirectoryError(
                f"{run_dir} is being written by {_describe(holder)} (it holds the directory's lock; "
                f"{self.path} names it); a second writer would interleave its steps with that run's. "
                "Wait for it to finish or stop it, or start this one elsewhere (another "
                "trainer.experiment_name or trainer.run_dir)."
            ) from None
        previous = read_holder(self.path)
        if previous and previous.get("host") != HOST:
            os.close(dir_fd)
            raise RunDirectoryError(
                f"{self.path} names {_describe(previous)}, on another host: it may still be running "
                f"there, which cannot be checked from {HOST}. If it is not, delete {self.path}."
            )
        self.taken_over = previous or None
        self._dir_fd = dir_fd
        try:
            record = json.dumps({"pid": os.getpid(), "host": HOST, "since": now()})
            _write_record(self.path, record)
        except OSError as err:
            self.release()
            raise _unwritable(self.path, err) from None
        except BaseException:
            self.release()
            raise
        return self

    def release(self) -> None:
        if self._dir_fd is None:
            return
        dir_fd, self._dir_fd = self._dir_fd, None
        try:
            if self.path.is_file():
                _write_record(self.path, "")  # an empty record: nobody holds it
        except OSError:
            pass  # a full disk or a read-only directory: the kernel lock below is what counts
        finally:
            fcntl.flock(dir_fd, fcntl.LOCK_UN)
            os.close(dir_fd)

    @property
    def held(self) -> bool:
        return self._dir_fd is not None


def is_locked(run_dir: str | Path) -> bool | None:
    """Whether a process holds `run_dir`'s lock now (a shared probe, released at once); None when
    the directory cannot be opened."""
    try:
        dir_fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        if _try_flock(dir_fd, fcntl.LOCK_SH, tries=1):
            fcntl.flock(dir_fd, fcntl.LOCK_UN)
            return False
        return True
    finally:
        os.close(dir_fd)


def _unwritable(path: Path, err: OSError) -> RunDirectoryError:
    return RunDirectoryError(
        f"cannot write the run directory: {path}: {err.strerror} (errno {err.errno}, "
        f"{errno.errorcode.get(err.errno, '?')}); a run needs its directory writable, with free space "
        "(another trainer.run_dir or trainer.output_root)"
    )


def _try_flock(fd: int, mode: int, *, tries: int = 5) -> bool:
    """flock without waiting; a few short retries ride out another process's probe (`is_locked`)."""
    for attempt in range(tries):
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if attempt + 1 < tries:
                time.sleep(0.05)
    return False


def _write_record(path: Path, text: str) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, text.encode(), 0)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_holder(path: Path) -> dict[str, Any]:
    """The holder `run.lock` names ({} when empty, absent or unreadable)."""
    try:
        data = path.read_bytes()[:4096]
    except OSError:
        return {}
    try:
        holder = json.loads(data) if data.strip() else {}
    except json.JSONDecodeError:
        return {}
    return holder if isinstance(holder, dict) else {}


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "another process"
    return f"pid {holder.get('pid')} on host {holder.get('host')} (since {holder.get('since')})"
