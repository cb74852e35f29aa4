"""Layer 5, rewards: the operating-system layer of the sandbox — a bubblewrap namespace per run.

Each run of untrusted code is `bwrap` (bubblewrap, the sandbox of Flatpak) with new user, mount,
PID, IPC, UTS, cgroup and network namespaces; the only writable place is a size-limited tmpfs at
/work (its size caps all files together); /usr and the interpreter's prefix are bound read-only,
/proc shows only the sandbox's own processes, nested user namespaces are refused, and the program
runs as an unprivileged user: `nobody` inside, and outside a uid that no account and no other
run uses (when the trainer is root; otherwise the invoking user's own uid, which is unprivileged
already). `prlimit` (util-linux) sets the kernel limits on address space, CPU seconds, file size,
open files and processes after the namespace exists, so the process cap counts the sandbox's
processes only. Nothing here runs inside the sandbox; nothing the program does can change it.
"""

from __future__ import annotations

import functools
import itertools
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

BWRAP = "bwrap"  # looked up on PATH at run time (a test points it elsewhere to see the refusal)
PRLIMIT = "/usr/bin/prlimit"
INSTALL_HINT = "install bubblewrap (`apt-get install bubblewrap`; `make setup` does it where it can)"
WORKDIR = "/work"
INNER_ID = 65534  # nobody / nogroup inside the namespace
# Outside uids for runs started by root: far above any account, one per concurrent run of this process.
OUTER_UID_BASE = 1_900_000_000
_RUN_COUNTER = itertools.count()
# Top-level directories that are symlinks into /usr on merged-/usr systems, real ones elsewhere.
SYSTEM_ROOTS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


class SandboxUnavailableError(RuntimeError):
    """The OS sandbox cannot run here; code is refused rather than run unconfined (a setup error)."""


@dataclass(frozen=True)
class NamespaceLimits:
    """What the kernel enforces for one run (bytes and counts as the kernel counts them)."""

    cpu_seconds: int
    address_space_bytes: int
    file_bytes: int
    disk_bytes: int
    open_files: int
    processes: int
    isolate_network: bool


def find_bwrap() -> str | None:
    return shutil.which(BWRAP)


def sandbox_problem() -> str | None:
    """Why the sandbox cannot run on this machine, or None when it can (probed once per bwrap path)."""
    return _probe(find_bwrap())


def require_sandbox() -> None:
    problem = sandbox_problem()
    if problem is not None:
        raise SandboxUnavailableError(f"the code sandbox cannot run: {problem}")


@functools.cache
def _probe(bwrap: str | None) -> str | None:
    if bwrap is None:
        return f"bubblewrap (`{BWRAP}`) is not on PATH; {INSTALL_HINT}"
    if not os.access(PRLIMIT, os.X_OK):
        return f"{PRLIMIT} (util-linux) is missing"
    usage = subprocess.run([bwrap, "--help"], capture_output=True, text=True).stdout
    if "--disable-userns" not in usage:
        return f"{bwrap} is older than bubblewrap 0.8 (no --disable-userns); {INSTALL_HINT}"
    interpreter = sandbox_interpreter()
    if interpreter is None:
        return "no Python that an unprivileged user can read (tried this interpreter and /usr/bin/python3)"
    probe = subprocess.run(
        [*namespace_command(bwrap, interpreter, [], _probe_limits()), interpreter, "-I", "-S", "-c", "pass"],
        capture_output=True,
        text=True,
        timeout=30,
        **identity_kwargs(),
    )
    if probe.returncode != 0:
        return f"bubblewrap could not create the namespaces here: {probe.stderr.strip()[:300]}"
    return None


def _probe_limits() -> NamespaceLimits:
    return NamespaceLimits(10, 2**30, 2**20, 2**20, 64, 16, isolate_network=True)


@functools.cache
def sandbox_interpreter() -> str | None:
    """A Python the sandbox user can read: this one when its prefix is world-readable (a pyenv under
    /root is not), else the system's. The program may use the standard library only, so any CPython
    does; its prefix is bound read-only at the same path."""
    for candidate in (os.path.realpath(sys.executable), "/usr/bin/python3"):
        real = os.path.realpath(candidate)
        if os.path.isfile(real) and _world_readable(Path(real)):
            return real
    return None


def _world_readable(path: Path) -> bool:
    """Every directory above `path` can be searched by others, and `path` read and executed."""
    for parent in path.parents:
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return False
    mode = os.stat(path).st_mode
    return bool(mode & stat.S_IROTH and mode & stat.S_IXOTH)


def _interpreter_prefix(interpreter: str) -> str:
    """The directory to bind for `interpreter`: /usr covers the system's; /opt/py/bin/python3 → /opt/py."""
    prefix = str(Path(interpreter).parent.parent)
    return "/usr" if prefix == "/usr" or prefix.startswith("/usr/") else prefix


def identity_kwargs() -> dict:
    """Popen keyword arguments that start bwrap as an unprivileged user: a fresh uid when we are root
    (so the kernel's process limit, signal checks and file ownership never see root), nothing
    otherwise."""
    if os.geteuid() != 0:
        return {}
    uid = OUTER_UID_BASE + (os.getpid() % 100_000) * 64 + next(_RUN_COUNTER) % 64
    return {"user": uid, "group": uid, "extra_groups": []}


def namespace_command(
    bwrap: str, interpreter: str, data_fds: list[tuple[int, str]], limits: NamespaceLimits, info_fd: int = -1
) -> list[str]:
    """bwrap's arguments, then prlimit's, ending where the interpreter's command line starts.

    data_fds: (fd, path inside) pairs copied into read-only files, e.g. the program itself."""
    args = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent"]
    args += ["--new-session", "--uid", str(INNER_ID), "--gid", str(INNER_ID), "--hostname", "sandbox"]
    if not limits.isolate_network:
        args.append("--share-net")
    args += ["--ro-bind", "/usr", "/usr"]
    for name in SYSTEM_ROOTS:
        path = f"/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    prefix = _interpreter_prefix(interpreter)
    if prefix != "/usr":
        args += ["--ro-bind", prefix, prefix]
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--perms", "1777", "--size", str(limits.disk_bytes), "--tmpfs", WORKDIR]
    args += ["--symlink", WORKDIR, "/tmp"]
    for fd, inside in data_fds:
        args += ["--ro-bind-data", str(fd), inside]
    args += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", WORKDIR]
    if info_fd >= 0:
        args += ["--info-fd", str(info_fd)]
    # CPU: the soft limit sends SIGXCPU (a "timeout"), the hard one a second later SIGKILLs a program
    # that catches it.
    args += [
        "--",
        PRLIMIT,
        f"--cpu={limits.cpu_seconds}:{limits.cpu_seconds + 1}",
        f"--as={limits.address_space_bytes}",
        f"--fsize={limits.file_bytes}",
        f"--nofile={limits.open_files}",
        f"--nproc={limits.processes}",
        "--core=0",
        "--",
    ]
    return args
