"""Layer 5, rewards: the second layer of the sandbox — an audit hook installed before the program runs.

Run as `python -I -S -B guard.py CONFIG_JSON PROGRAM` inside the OS sandbox (`sandbox_namespace`);
stdlib only. It installs an audit hook (PEP 578) that refuses process creation, signals, sockets,
native code (ctypes), subinterpreters (audit hooks are per interpreter: code run in a new one
would not be seen), file access outside the working directory (reads of the standard library
excepted) and the introspection that would reach the hook itself (gc, frames), then executes the
program as a module of its own. The hook's policy lives in its closure, bound when it is made, so
rewriting this file's globals, `os.path` or `builtins` afterwards changes nothing. It is a second
layer only: what contains the program is the namespace around it, tested with the hook turned off.
"""

from __future__ import annotations

import builtins
import json
import os
import sys
import sysconfig
import types

# Events refused outright (prefix match): process creation, signalling, sockets, native code,
# creating an interpreter (its code would run without this hook), introspection that could reach
# the hook's frame or closure.
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
    "os.mkfifo",
    "os.mknod",
    "os.setxattr",
    "os.removexattr",
    "subprocess.",
    "signal.pthread_kill",
    "socket.",
    "ctypes.",
    "resource.setrlimit",
    "resource.prlimit",
    "sys.remote_exec",
    "sys._getframe",
    "sys._current_frames",
    "sys._current_exceptions",
    "gc.get_objects",
    "gc.get_referrers",
    "gc.get_referents",
    "sqlite3.",
    "cpython.PyInterpreterState_New",
)
# Sockets stay importable (asyncio imports them); creating or using one is refused by event.
# A dotted name is matched whole, any other by its top-level package.
BLOCKED_IMPORTS = frozenset(
    {
        "_posixsubprocess",
        "ctypes",
        "_ctypes",
        "_multiprocessing",
        "_sqlite3",
        "_xxsubinterpreters",  # subinterpreters: 3.11-3.12
        "_xxinterpchannels",
        "_interpreters",  # 3.13+
        "_interpchannels",
        "_interpqueues",
        "concurrent.interpreters",  # 3.14+
    }
)
# Attribute reads that hand out frames (audited by CPython as object.__getattr__).
FRAME_ATTRIBUTES = frozenset({"tb_frame", "f_back", "gi_frame", "cr_frame", "ag_frame", "f_globals"})
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
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def read_roots() -> tuple[str, ...]:
    """What the program may read besides its directory: this interpreter's standard library."""
    paths = sysconfig.get_paths()
    return tuple(sorted({os.path.realpath(paths[key]) for key in ("stdlib", "platstdlib")}))


def make_hook(
    workdir: str,
    roots: tuple[str, ...],
    *,
    _blocked=BLOCKED_PREFIXES,
    _imports=BLOCKED_IMPORTS,
    _frames=FRAME_ATTRIBUTES,
    _path_events=PATH_EVENTS,
    _listing=LISTING_EVENTS,
    _write_flags=WRITE_FLAGS,
    _realpath=os.path.realpath,
    _join=os.path.join,
    _fspath=os.fspath,
    _fsdecode=os.fsdecode,
    _sep=os.sep,
    _isinstance=builtins.isinstance,
    _any=builtins.any,
    _str=builtins.str,
    _bool=builtins.bool,
    _len=builtins.len,
    _error=PermissionError,
):
    """The audit hook: raise PermissionError for any event the sandbox does not allow. Everything it
    calls is bound here, at creation, so later changes to modules the program can reach do nothing."""

    def inside(path: str, allowed: tuple[str, ...]) -> bool:
        return _any(path == root or path.startswith(root + _sep) for root in allowed)

    def resolve(path) -> str | None:
        if _isinstance(path, int) or path is None:
            return None  # an already-open descriptor: it was opened under this same policy
        if _isinstance(path, bytes):
            path = _fsdecode(path)
        return _realpath(_join(workdir, _fspath(path)))

    def hook(event: str, args: tuple) -> None:
        if event.startswith(_blocked):
            raise _error(f"sandbox: {event} is not allowed")
        if (
            event == "import"
            and args
            and (_str(args[0]) in _imports or _str(args[0]).split(".")[0] in _imports)
        ):
            raise _error(f"sandbox: importing {args[0]} is not allowed")
        if event == "object.__getattr__" and _len(args) > 1 and args[1] in _frames:
            raise _error(f"sandbox: reading {args[1]} is not allowed")
        if event == "open" and args:
            path = resolve(args[0])
            if path is None:
                return
            mode, flags = (args[1] if _len(args) > 1 else "r") or "r", args[2] if _len(args) > 2 else 0
            writes = _any(c in _str(mode) for c in "wax+") or _bool((flags or 0) & _write_flags)
            if inside(path, (workdir,)) or (not writes and inside(path, roots)):
                return
            raise _error(f"sandbox: access to {args[0]!r} is not allowed")
        if event in _path_events and args:
            path = resolve(args[0])
            allowed = (workdir, *roots) if event in _listing else (workdir,)
            if path is not None and not inside(path, allowed):
                raise _error(f"sandbox: {event} on {args[0]!r} is not allowed")

    return hook


def main(argv: list[str]) -> None:
    config = json.loads(argv[1])
    workdir = os.path.realpath(config["workdir"])
    os.chdir(workdir)
    with open(argv[2], encoding="utf-8") as f:
        source = f.read()
    code = compile(source, os.path.basename(argv[2]), "exec")
    roots = read_roots()
    sys.argv = [os.path.basename(argv[2])]
    sys.path[:] = [p for p in sys.path if any(os.path.realpath(p).startswith(r) for r in roots)]
    # The program's own __main__: `import __main__` must not hand it this module's namespace.
    program = types.ModuleType("__main__")
    program.__builtins__ = builtins
    sys.modules["__main__"] = program
    if config["python_guard"]:
        sys.addaudithook(make_hook(workdir, roots))
    exec(code, program.__dict__)


if __name__ == "__main__":
    main(sys.argv)
