"""Layer 5, rewards: run untrusted Python in a separate, limited process (code scorer, python tool).

Each run gets a throw-away working directory, an environment with nothing of the parent's, its own
process group (killed as a whole when the run ends), a wall-clock limit, a cap on captured output,
and — inside the child, before the program starts (`sandbox_guard`) — kernel limits on CPU time,
memory, file size and open files, a private network namespace where the kernel allows it, and an
audit hook that refuses process creation, sockets, native code and file access outside the working
directory. What each layer stops is tested in tests/reward/test_sandbox.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

GUARD = Path(__file__).with_name("sandbox_guard.py")
PROGRAM_NAME = "main.py"


@dataclass(frozen=True)
class SandboxLimits:
    """wall_seconds: kill after this long; cpu_seconds: kernel CPU limit (SIGXCPU, then SIGKILL);
    memory_mb: address-space limit; output_bytes: stdout and stderr are each cut here and the run is
    killed; file_mb: largest file the program may write; isolate_network: try a new network namespace
    (the audit hook refuses sockets either way)."""

    wall_seconds: float = 5.0
    cpu_seconds: int = 5
    memory_mb: int = 512
    output_bytes: int = 64_000
    file_mb: int = 16
    open_files: int = 64
    isolate_network: bool = True


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
    """Run `code` as `main.py` in a fresh directory with `stdin` as its standard input."""
    limits = limits or SandboxLimits()
    with tempfile.TemporaryDirectory(prefix="stratarl-sandbox-") as workdir:
        program = Path(workdir) / PROGRAM_NAME
        program.write_text(code, encoding="utf-8")
        config = {
            "workdir": workdir,
            "cpu_seconds": int(limits.cpu_seconds),
            "memory_bytes": int(limits.memory_mb) * 2**20,
            "file_bytes": int(limits.file_mb) * 2**20,
            "open_files": int(limits.open_files),
            "isolate_network": limits.isolate_network,
            "read_roots": _read_roots(),
        }
        command = [sys.executable, "-I", "-S", "-B", str(GUARD), json.dumps(config), str(program)]
        return _supervise(command, workdir, stdin, limits)


def _read_roots() -> list[str]:
    """Directories the program may read: the standard library only (no site-packages)."""
    paths = sysconfig.get_paths()
    return sorted({os.path.realpath(paths[key]) for key in ("stdlib", "platstdlib")})


def _supervise(command: list[str], workdir: str, stdin: str, limits: SandboxLimits) -> SandboxResult:
    start = time.monotonic()
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
    proc = subprocess.Popen(
        command,
        cwd=workdir,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, so every descendant dies with it
        close_fds=True,
    )
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
    _kill_group(proc)
    returncode = proc.wait()
    for reader in readers:
        reader.join()
    out, err = (reader.text() for reader in readers)
    status = _status(returncode, timed_out, overflow.is_set())
    return SandboxResult(status, returncode, out, err, time.monotonic() - start)


def _status(returncode: int, timed_out: bool, overflow: bool) -> str:
    if overflow:
        return "output_limit"
    if timed_out or returncode == -signal.SIGXCPU:
        return "timeout"
    if returncode == 0:
        return "ok"
    return "killed" if returncode < 0 else "error"


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the run's whole process group (the program and anything it managed to start)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _feed(stream: IO[bytes] | None, text: str) -> None:
    if stream is None:
        return
    try:
        stream.write(text.encode("utf-8"))
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
