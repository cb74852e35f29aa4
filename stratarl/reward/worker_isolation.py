"""Layer 5, rewards: how a `CallPool` worker is kept apart from the trainer — a PID namespace of its own.

Where bubblewrap can make one (`pid_namespace_problem()` is None), each worker runs in a new PID
namespace (`bwrap --dev-bind / / --unshare-pid --die-with-parent --new-session`): the same files,
user and devices as the trainer, but no process outside the namespace has a pid it can name, so
user code cannot signal the trainer (`os.kill(os.getppid(), 9)` signals bwrap's init, process 1
of the namespace, which ignores it). When the worker is replaced or the pool closes, the pool
SIGKILLs bwrap; when the trainer dies, bwrap's parent-death signal does; bwrap's init then dies
and the kernel kills every process left in the namespace, `setsid` and double-forked
grandchildren included. Elsewhere the worker is a plain
child in a session of its own: killed as a process group, and it asks the kernel for SIGKILL when
the trainer's thread that started it ends (`set_parent_death_signal`); there, user code can still
signal the trainer and a grandchild that calls `setsid` outlives the run. `start_worker` starts a
worker command either way, `kill_worker` ends it with what it started, `ended_reason` says how it
ended. Stdlib only.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

BWRAP = "bwrap"
PR_SET_PDEATHSIG = 1
INFO_WAIT_S = 5.0  # how long bwrap may take to say the worker's pid


def namespace_prefix(info_fd: int) -> list[str]:
    """bwrap's arguments that start the worker in its own PID namespace; bwrap writes the pid of
    the namespace's init (the worker's parent) as the trainer sees it to `info_fd` (JSON, key
    `child-pid`)."""
    bwrap = shutil.which(BWRAP) or BWRAP
    # --new-session: the worker's process group is its own, inside the namespace; bwrap's (outside)
    # cannot be signalled as "pid 0"
    args = [bwrap, "--dev-bind", "/", "/", "--unshare-pid", "--die-with-parent"]
    return [*args, "--new-session", "--proc", "/proc", "--info-fd", str(info_fd), "--"]


def pid_namespace_problem() -> str | None:
    """Why workers cannot get a PID namespace here, or None when they can (probed once)."""
    return _probe(shutil.which(BWRAP))


@functools.cache
def _probe(bwrap: str | None) -> str | None:
    if bwrap is None:
        return f"bubblewrap (`{BWRAP}`) is not on PATH"
    read_fd, write_fd = os.pipe()
    try:
        probe = subprocess.run(
            [*namespace_prefix(write_fd), sys.executable, "-S", "-c", "import os; assert os.getppid() == 1"],
            capture_output=True,
            text=True,
            timeout=30,
            pass_fds=(write_fd,),
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"{bwrap} could not run: {err}"
    finally:
        os.close(read_fd)
        os.close(write_fd)
    if probe.returncode != 0:
        return f"{bwrap} could not create a PID namespace: {probe.stderr.strip()[:300]}"
    return None


def set_parent_death_signal(expected_parent: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent ends (Linux `prctl`); exit now if the
    parent already ended before the request was made (then `getppid()` is no longer `expected_parent`)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if expected_parent > 0 and os.getppid() != expected_parent:
        os._exit(1)


def start_worker(argv: list[str], keep_fd: int, *, in_namespace: bool) -> tuple[subprocess.Popen, int]:
    """Start the worker command `argv` (a `python -c ...` whose last argument, added here, is the pid
    it must die with: 0 inside a PID namespace) in a session of its own, passing it `keep_fd`; in a
    PID namespace of its own when `in_namespace`. Returns the process (bwrap, when in a namespace)
    and the worker's pid as this process sees it (what its stack dumps are asked of)."""
    if in_namespace:  # bwrap writes the worker's pid to the info pipe
        info_read, info_write = os.pipe()
        command = [*namespace_prefix(info_write), *argv, "0"]
    else:
        info_read, info_write = -1, -1
        command = [*argv, str(os.getpid())]  # the parent it dies with
    try:
        process = subprocess.Popen(
            command,
            pass_fds=tuple(fd for fd in (keep_fd, info_write) if fd >= 0),
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: killed with whatever user code started
        )
    finally:
        if info_write >= 0:
            os.close(info_write)
    worker_pid = process.pid
    if info_read >= 0:
        worker_pid = _namespace_pid(info_read, process.pid)
        os.close(info_read)
    return process, worker_pid


def kill_worker(process: subprocess.Popen) -> None:
    """SIGKILL the worker's process group: the worker and what user code started, or bwrap around
    it (bwrap's init then dies, and the kernel kills all inside its PID namespace); and reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)


def ended_reason(returncode: int | None, *, in_namespace: bool) -> tuple[str, str]:
    """("process_crash", "killed by SIGSEGV") or ("process_exit", "the process exited with code 3")
    for a worker that ended by itself with `returncode` (bwrap's, when `in_namespace`)."""
    if in_namespace and returncode is not None and returncode > 128:
        returncode = 128 - returncode  # bwrap exits 128 + N when a signal N killed the worker
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return "process_crash", f"killed by {name}"
    return "process_exit", f"the process exited with code {returncode}"


def _namespace_pid(info_read: int, fallback: int) -> int:
    """The worker's pid as the trainer sees it: the one child of the namespace's init, whose pid
    bwrap writes to --info-fd (both read with a deadline; `fallback` when they do not come)."""
    deadline = time.monotonic() + INFO_WAIT_S
    init = _read_info_pid(info_read, deadline)
    while init is not None and time.monotonic() < deadline:
        children = _children(init)
        if children:
            return children[0]
        time.sleep(0.005)
    return fallback


def _read_info_pid(info_read: int, deadline: float) -> int | None:
    data = b""
    poller = select.poll()
    poller.register(info_read, select.POLLIN)
    while time.monotonic() < deadline:
        if not poller.poll(max(deadline - time.monotonic(), 0) * 1000):
            break
        chunk = os.read(info_read, 4096)
        if not chunk:
            break
        data += chunk
        with contextlib.suppress(ValueError, KeyError, TypeError):
            return int(json.loads(data)["child-pid"])
    return None


def _children(pid: int) -> list[int]:
    """Children of `pid` (/proc/PID/task/PID/children; a scan of /proc where the kernel lacks it)."""
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        pass
    except OSError:
        return []
    found = []
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if (
                entry.isdigit()
                and int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid
            ):
                found.append(int(entry))
    return found
