"""Layer 5, rewards: the first code a sandboxed interpreter runs, before the untrusted program.

Run as `python -I -S -B sandbox_guard.py CONFIG_JSON PROGRAM` by `stratarl.reward.sandbox`; stdlib
only. In order it: sets kernel resource limits (CPU seconds, address space, file size, open files,
no core dumps), moves into a fresh network namespace when the kernel allows it (no interface but a
down loopback), installs an audit hook (PEP 578) that refuses process creation, signals to other
processes, sockets, foreign-code loading (ctypes) and any file access outside the working directory
(reads of the standard library excepted), and finally executes the program as `__main__`.

An audit hook cannot be removed once installed, and the events it blocks are raised in C by the
interpreter itself, so the program cannot route around them from Python code.
"""

from __future__ import annotations

import json
import os
import resource
import sys

CLONE_NEWNET, CLONE_NEWUSER = 0x40000000, 0x10000000

# Events refused outright (prefix match): process creation, signalling, sockets, native code.
BLOCKED_PREFIXES = (
    "os.fork",
    "os.forkpty",
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.kill",
    "os.killpg",
    "os.setsid",
    "os.symlink",
    "os.link",
    "os.chroot",
    "subprocess.",
    "signal.pthread_kill",
    "socket.",
    "ctypes.",
    "resource.setrlimit",
    "resource.prlimit",
    "sys.remote_exec",
)
# Sockets stay importable (asyncio imports them); creating or using one is refused by event.
BLOCKED_IMPORTS = frozenset({"_posixsubprocess", "ctypes", "_ctypes", "_multiprocessing"})
# Events whose first argument is a path that must stay inside the working directory (reads of the
# read roots allowed for the listing events).
PATH_EVENTS = frozenset(
    {
        "os.listdir",
        "os.scandir",
        "os.remove",
        "os.rename",
        "os.rmdir",
        "os.mkdir",
        "os.chmod",
        "os.chown",
        "os.utime",
        "os.truncate",
        "os.chdir",
        "shutil.rmtree",
        "shutil.copyfile",
        "shutil.move",
    }
)
LISTING_EVENTS = frozenset({"os.listdir", "os.scandir"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def set_limits(config: dict) -> None:
    """Kernel-enforced ceilings; soft == hard so the program cannot raise them back.

    The CPU limit is the exception: soft = cpu_seconds sends SIGXCPU (reported as "timeout"), and the
    hard limit one second later SIGKILLs a program that catches it. With soft == hard the kernel may
    deliver SIGKILL first, and a CPU timeout would be indistinguishable from an out-of-memory kill.
    """
    cpu = config["cpu_seconds"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    limits = {
        resource.RLIMIT_AS: config["memory_bytes"],
        resource.RLIMIT_FSIZE: config["file_bytes"],
        resource.RLIMIT_NOFILE: config["open_files"],
        resource.RLIMIT_CORE: 0,
    }
    for which, value in limits.items():
        resource.setrlimit(which, (value, value))


def isolate_network() -> bool:
    """Enter a new, empty network namespace (as root, or through a user namespace); False if refused."""
    import ctypes  # loaded here, before the audit hook refuses it to the program

    libc = ctypes.CDLL(None, use_errno=True)
    flags = CLONE_NEWNET if os.geteuid() == 0 else CLONE_NEWUSER | CLONE_NEWNET
    return libc.unshare(flags) == 0


def _inside(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root + os.sep) for root in roots)


def make_hook(workdir: str, read_roots: tuple[str, ...]):
    """The audit hook: raise PermissionError for any event the sandbox does not allow."""

    def resolve(path) -> str | None:
        if isinstance(path, int) or path is None:
            return None  # an already-open descriptor: it was opened under this same policy
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        return os.path.realpath(os.path.join(workdir, os.fspath(path)))

    def hook(event: str, args: tuple) -> None:
        if event.startswith(BLOCKED_PREFIXES):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "import" and args and str(args[0]).split(".")[0] in BLOCKED_IMPORTS:
            raise PermissionError(f"sandbox: importing {args[0]} is not allowed")
        if event == "open" and args:
            path = resolve(args[0])
            if path is None:
                return
            mode, flags = (args[1] if len(args) > 1 else "r") or "r", args[2] if len(args) > 2 else 0
            writes = any(c in str(mode) for c in "wax+") or bool((flags or 0) & _WRITE_FLAGS)
            if _inside(path, (workdir,)) or (not writes and _inside(path, read_roots)):
                return
            raise PermissionError(f"sandbox: access to {args[0]!r} is not allowed")
        if event in PATH_EVENTS and args:
            path = resolve(args[0])
            allowed = (workdir, *read_roots) if event in LISTING_EVENTS else (workdir,)
            if path is not None and not _inside(path, allowed):
                raise PermissionError(f"sandbox: {event} on {args[0]!r} is not allowed")

    return hook


def main(argv: list[str]) -> None:
    config = json.loads(argv[1])
    workdir = os.path.realpath(config["workdir"])
    os.chdir(workdir)
    set_limits(config)
    if config["isolate_network"]:
        isolate_network()
    with open(argv[2], encoding="utf-8") as f:
        source = f.read()
    code = compile(source, os.path.basename(argv[2]), "exec")
    sys.argv = [os.path.basename(argv[2])]
    sys.path[:] = [p for p in sys.path if _inside(os.path.realpath(p), tuple(config["read_roots"]))]
    sys.addaudithook(make_hook(workdir, tuple(config["read_roots"])))
    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})


if __name__ == "__main__":
    main(sys.argv)
