"""Layer 5, rewards: the worker process of a `call_pool.CallPool` — runs user code, one call at a time.

Started as `python -c ... FD PARENT` (FD: its end of a socket pair with the pool; PARENT: the pid
it must die with, 0 inside a PID namespace, see `worker_isolation`). Messages are `call_frames`
frames. It receives its setup (the parent's sys.path, the output cap), then the pickled handler
(unpickling imports the user's code: a failure is reported, not raised), says "ready", and then
answers each job with one result message: the `CallResult` fields as plain strings and numbers,
and the returned value pickled on its own, so a value the trainer cannot unpickle costs that one
call (`bad_return`), never the message or the pool. On SIGUSR1 it writes every thread's stack
to the file its setup names (faulthandler: in C, so even a call stuck in a C loop answers) — the
pool asks before it kills a call that ran out of time, to say where it was. Whatever a call
raises — SystemExit and KeyboardInterrupt included — is its result's `reason`. The process's
stdout and stderr (file descriptors 1 and 2, so C extensions and child processes too) go to a
pipe drained by a thread:
each call's bytes are counted and the first `max_output_bytes` kept; nothing of it reaches the
trainer's terminal or log. Stdlib only, so a worker starts in a fraction of a second.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import pickle
import signal
import socket
import sys
import threading
import traceback
from dataclasses import dataclass, fields
from typing import Any

from stratarl.reward.call_frames import recv_frame, send_frame
from stratarl.reward.worker_isolation import set_parent_death_signal


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
    try:
        text = str(err)
    except Exception:  # an exception whose __str__ raises is still reported, by its class name
        text = "<message could not be printed>"
    return f"{type(err).__name__}: {text}"[:300]


def result_message(result: CallResult) -> bytes:
    """("result", the fields but `value` as plain data, the pickled value): the outer pickle holds
    only str/int/bytes, so it always unpickles in the trainer."""
    plain = {f.name: getattr(result, f.name) for f in fields(result) if f.name != "value"}
    try:
        value = pickle.dumps(result.value)
    except Exception as err:  # an unpicklable return value
        plain |= {"reason": "bad_return", "message": f"result cannot be sent back: {describe(err)}"[:300]}
        value = pickle.dumps(None)
    return pickle.dumps(("result", plain, value))


def main(argv: list[str]) -> None:
    set_parent_death_signal(int(argv[2]) if len(argv) > 2 else 0)
    sock = socket.socket(fileno=int(argv[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    setup = pickle.loads(recv_frame(sock))
    sys.path[:0] = [p for p in setup["sys_path"] if p not in sys.path]
    capture = OutputCapture(setup["max_output_bytes"])
    if setup.get("stack_path"):  # SIGUSR1: every thread's stack into this file (the pool asks on a timeout)
        stacks = open(setup["stack_path"], "w", encoding="utf-8")  # noqa: SIM115 (open for the process's life)
        faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True, chain=False)
    try:
        handler = pickle.loads(recv_frame(sock))
    except BaseException as err:
        failure = "".join(traceback.format_exception_only(type(err), err)).strip()
        send_frame(sock, pickle.dumps(("setup_failed", failure)))
        return
    capture.mark()  # what importing the handler printed is nobody's call
    send_frame(sock, pickle.dumps(("ready", os.getpid())))
    while True:
        try:
            job = pickle.loads(recv_frame(sock))
        except (EOFError, OSError):
            return
        result = run_call(handler, job)
        result.output_bytes, result.output_head = capture.mark()
        send_frame(sock, result_message(result))


if __name__ == "__main__":
    main(sys.argv)
