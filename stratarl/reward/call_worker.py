"""Layer 5, rewards: the worker process of a `call_pool.CallPool` — runs user code, one call at a time.

Started as `python -m stratarl.reward.call_worker FD` (FD: its end of a socket pair with the pool).
It receives its setup (the parent's sys.path, the output cap), then the pickled handler (unpickling
imports the user's code: a failure is reported, not raised), says "ready", and then answers each
job with one `CallResult`. On SIGUSR1 it writes every thread's stack to the file its setup names
(faulthandler: in C, so even a call stuck in a C loop answers) — the pool asks before it kills a
call that ran out of time, to say where it was. Whatever a call raises — SystemExit and
KeyboardInterrupt included — is its result's `reason`. The process's stdout and stderr (file
descriptors 1 and 2, so C extensions and child processes too) go to a pipe drained by a thread:
each call's bytes are counted and the first `max_output_bytes` kept; nothing of it reaches the
trainer's terminal or log. Stdlib only, so a worker starts in a fraction of a second.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import pickle
import signal
import sys
import threading
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any


@dataclass
class CallResult:
    """One call's outcome. reason: None (returned `value`), the class name of what it raised
    (e.g. "SystemExit", "ValueError"), or from the pool "timeout", "process_exit" (the process
    ended: `os._exit`), "process_crash" (killed by a signal: a segfault, the OOM killer),
    "pool_broken", "pool_closed". output_bytes: what it printed; output_head: the first bytes."""

    value: Any = None
    reason: str | None = None
    message: str = ""
    output_bytes: int = 0
    output_head: str = ""


class OutputCapture:
    """fd 1 and 2 into a pipe; `mark()` ends a call and returns (its byte count, its first bytes)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.marker = b"\0stratarl-call-end-" + os.urandom(8).hex().encode() + b"\0"
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 1)
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self.lock = threading.Condition()
        self.count, self.head, self.marks = 0, bytearray(), 0
        threading.Thread(target=self._drain, args=(read_fd,), daemon=True).start()

    def _drain(self, fd: int) -> None:
        pending = b""
        while chunk := os.read(fd, 65536):
            pending += chunk
            while (at := pending.find(self.marker)) >= 0:
                self._take(pending[:at])
                pending = pending[at + len(self.marker) :]
                with self.lock:
                    self.marks += 1
                    self.lock.notify_all()
            keep = len(self.marker) - 1  # a marker may be split across two reads
            self._take(pending[:-keep] if len(pending) > keep else b"")
            pending = pending[-keep:] if len(pending) > keep else pending

    def _take(self, data: bytes) -> None:
        with self.lock:
            self.count += len(data)
            room = self.max_bytes - len(self.head)
            if room > 0:
                self.head += data[:room]

    def mark(self) -> tuple[int, str]:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # user code may have replaced or closed them
                stream.flush()
        with self.lock:
            target = self.marks + 1
        os.write(1, self.marker)
        with self.lock:
            self.lock.wait_for(lambda: self.marks >= target, timeout=5)
            result = (self.count, bytes(self.head).decode("utf-8", errors="replace"))
            self.count, self.head = 0, bytearray()
        return result


def run_call(handler: Any, job: Any) -> CallResult:
    """handler(job) as a `CallResult`; nothing it raises escapes."""
    try:
        return CallResult(value=handler(job))
    except BaseException as err:  # SystemExit too: user code must never end the worker by raising
        return CallResult(reason=type(err).__name__, message=describe(err))


def describe(err: BaseException) -> str:
    if isinstance(err, SystemExit):
        return f"exit code {err.code!r}"
    return f"{type(err).__name__}: {err}"[:300]


def main(argv: list[str]) -> None:
    conn = Connection(int(argv[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    setup = conn.recv()
    sys.path[:0] = [p for p in setup["sys_path"] if p not in sys.path]
    capture = OutputCapture(setup["max_output_bytes"])
    if setup.get("stack_path"):  # SIGUSR1: every thread's stack into this file (the pool asks on a timeout)
        stacks = open(setup["stack_path"], "w", encoding="utf-8")  # noqa: SIM115 (open for the process's life)
        faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True, chain=False)
    try:
        handler = pickle.loads(conn.recv_bytes())
    except BaseException as err:
        conn.send(("setup_failed", "".join(traceback.format_exception_only(type(err), err)).strip()))
        return
    capture.mark()  # what importing the handler printed is nobody's call
    conn.send(("ready", os.getpid()))
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        result = run_call(handler, job)
        result.output_bytes, result.output_head = capture.mark()
        try:
            conn.send(result)
        except Exception as err:  # an unpicklable return value
            conn.send(CallResult(reason="bad_return", message=f"result cannot be sent back: {err}"[:300]))


if __name__ == "__main__":
    main(sys.argv)
