"""Layer 5, rewards: run untrusted Python in the OS sandbox (code scorer, python tool).

Containment comes from the operating system (`sandbox_namespace`: a bubblewrap namespace as an
unprivileged user, a size-capped private /work, read-only system paths, no network, no view of
other processes, kernel limits on memory, CPU, files and processes). The parent adds a wall-clock
limit, a cap on captured output, and on every exit a SIGKILL of the namespace's first process,
which makes the kernel kill every process left inside. As a second layer only, `sandbox_guard`
installs an audit hook in the interpreter before the program starts. When the OS sandbox cannot
run here, `run_python` raises `SandboxUnavailableError`: code is never run unconfined.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from stratarl.reward.sandbox_namespace import (
    WORKDIR,
    NamespaceLimits,
    SandboxUnavailableError,
    find_bwrap,
    identity_kwargs,
    namespace_command,
    require_sandbox,
    sandbox_interpreter,
)

__all__ = ["SandboxLimits", "SandboxResult", "SandboxUnavailableError", "run_python"]

GUARD = Path(__file__).with_name("sandbox_guard.py")
GUARD_INSIDE, PROGRAM_INSIDE = "/sandbox/guard.py", "/sandbox/main.py"
ENVIRONMENT = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": WORKDIR, "TMPDIR": WORKDIR}


@dataclass(frozen=True)
class SandboxLimits:
    """wall_seconds: kill after this long; cpu_seconds: kernel CPU limit per process (SIGXCPU, then
    SIGKILL); memory_mb: address space per process; processes: most processes and threads at once;
    disk_mb: all files in /work together; file_mb: largest single file; output_bytes: stdout and
    stderr are each cut here and the run is killed; isolate_network: a network namespace with
    nothing in it (false shares the host's; the audit hook still refuses sockets); python_guard:
    install the audit hook as a second layer (false tests the OS layer alone)."""

    wall_seconds: float = 5.0
    cpu_seconds: int = 5
    memory_mb: int = 512
    processes: int = 16
    disk_mb: int = 64
    file_mb: int = 16
    output_bytes: int = 64_000
    open_files: int = 64
    isolate_network: bool = True
    python_guard: bool = True

    def namespace_limits(self) -> NamespaceLimits:
        return NamespaceLimits(
            cpu_seconds=int(self.cpu_seconds),
            address_space_bytes=int(self.memory_mb) * 2**20,
            file_bytes=int(self.file_mb) * 2**20,
            disk_bytes=int(self.disk_mb) * 2**20,
            open_files=int(self.open_files),
            processes=int(self.processes),
            isolate_network=self.isolate_network,
        )


@dataclass(frozen=True)
class SandboxResult:
    """What one run did. status: "ok" (exit 0), "error" (non-zero exit), "timeout" (wall or CPU limit),
    "output_limit" (too much output), or "killed" (a signal such as an out-of-memory kill)."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def run_python(code: str, *, stdin: str = "", limits: SandboxLimits | None = None) -> SandboxResult:
    """Run `code` as /sandbox/main.py with /work as its directory and `stdin` as its standard input.
    Raises SandboxUnavailableError when the OS sandbox cannot run here."""
    require_sandbox()
    limits = limits or SandboxLimits()
    interpreter = sandbox_interpreter()
    assert interpreter is not None  # require_sandbox checked it
    config = {"workdir": WORKDIR, "python_guard": limits.python_guard}
    program = code.encode("utf-8", errors="replace")  # a lone surrogate is a "?", not a crash
    with _data_fd(GUARD.read_bytes()) as guard_fd, _data_fd(program) as program_fd:
        info_read, info_write = os.pipe()
        try:
            command = namespace_command(
                find_bwrap() or "bwrap",
                interpreter,
                [(guard_fd, GUARD_INSIDE), (program_fd, PROGRAM_INSIDE)],
                limits.namespace_limits(),
                info_fd=info_write,
            )
            command += [interpreter, "-I", "-S", "-B", GUARD_INSIDE, json.dumps(config), PROGRAM_INSIDE]
            return _supervise(command, (guard_fd, program_fd, info_write), info_read, stdin, limits)
        finally:
            os.close(info_read)


@contextlib.contextmanager
def _data_fd(data: bytes):
    """An anonymous in-memory file holding `data`, for bwrap to copy into the sandbox."""
    fd = os.memfd_create("stratarl-sandbox", 0)
    try:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
        yield fd
    finally:
        os.close(fd)


def _supervise(
    command: list[str], pass_fds: tuple[int, ...], info_read: int, stdin: str, limits: SandboxLimits
) -> SandboxResult:
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            command,
            env=ENVIRONMENT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            pass_fds=pass_fds,
            **identity_kwargs(),
        )
    finally:
        os.close(pass_fds[-1])  # the info pipe's write end: bwrap's alone from here
    namespace = _NamespaceInfo(info_read)
    overflow = threading.Event()
    readers = [_CappedReader(stream, limits.output_bytes, overflow) for stream in (proc.stdout, proc.stderr)]
    threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True).start()
    timed_out = False
    deadline = start + limits.wall_seconds
    while proc.poll() is None:
        if overflow.is_set():
            break
        if time.monotonic() > deadline:
            timed_out = True
            break
        overflow.wait(0.01)
    _kill_namespace(proc, namespace)
    returncode = proc.wait()
    for reader in readers:
        reader.join()
    out, err = (reader.text() for reader in readers)
    status = _status(returncode, timed_out, overflow.is_set())
    return SandboxResult(status, returncode, out, err, time.monotonic() - start)


def _status(returncode: int, timed_out: bool, overflow: bool) -> str:
    """bwrap exits with the program's code, or 128 + the signal that killed it."""
    if overflow:
        return "output_limit"
    if timed_out or returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        return "timeout"
    if returncode == 0:
        return "ok"
    return "killed" if returncode < 0 or returncode > 128 else "error"


class _NamespaceInfo:
    """The host pid of the namespace's first process, read from bwrap's --info-fd."""

    def __init__(self, fd: int) -> None:
        self.pid: int | None = None
        self.thread = threading.Thread(target=self._read, args=(os.dup(fd),), daemon=True)
        self.thread.start()

    def _read(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as stream:
            data = stream.read()
        with contextlib.suppress(ValueError):
            self.pid = int(json.loads(data or b"{}").get("child-pid") or 0) or None


def _kill_namespace(proc: subprocess.Popen, namespace: _NamespaceInfo) -> None:
    """SIGKILL the namespace's first process (the kernel then kills everything inside the PID
    namespace, including processes that left the session) and bwrap's own process group."""
    namespace.thread.join(timeout=1)
    if namespace.pid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(namespace.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _feed(stream: IO[bytes] | None, text: str) -> None:
    if stream is None:
        return
    try:
        stream.write(text.encode("utf-8", errors="replace"))
        stream.close()
    except (BrokenPipeError, OSError):
        pass  # the program exited (or was killed) without reading its input


class _CappedReader:
    """Drain one pipe in a thread, keeping at most `cap` bytes; signal `overflow` past the cap."""

    def __init__(self, stream: IO[bytes] | None, cap: int, overflow: threading.Event) -> None:
        self.chunks: list[bytes] = []
        self.size = 0
        self.cap = cap
        self.overflow = overflow
        self.thread = threading.Thread(target=self._drain, args=(stream,), daemon=True)
        self.thread.start()

    def _drain(self, stream: IO[bytes] | None) -> None:
        if stream is None:
            return
        while chunk := stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536):
            keep = chunk[: max(self.cap - self.size, 0)]
            self.chunks.append(keep)
            self.size += len(keep)
            if len(keep) < len(chunk):
                self.overflow.set()
                break
        stream.close()

    def join(self) -> None:
        self.thread.join(timeout=5)

    def text(self) -> str:
        return b"".join(self.chunks).decode("utf-8", errors="replace")
