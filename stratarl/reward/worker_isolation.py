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
signal the trainer and a grandchild that calls `setsid` outlives the run. Stdlib only.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import signal
import subprocess
import sys

BWRAP = "bwrap"
PR_SET_PDEATHSIG = 1


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
