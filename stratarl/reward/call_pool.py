"""Layer 5, rewards: user code in K worker processes, each call under a deadline nothing can escape.

Python cannot stop a thread, and a call may block in C, swallow every exception, exit the process
or crash it; only a process boundary contains all of these. `CallPool(handler)` starts K workers
(`call_worker`, plain `python -c` processes: no re-import of the trainer's main module, no fork of
a process holding torch threads). A dispatcher thread hands one job at a time to each idle worker
and starts that job's clock when the worker takes it; a worker still busy after `timeout_s`, or
one that ended, is killed with its whole process group and replaced, and its job resolves with
reason `timeout`, `process_exit` or `process_crash`. Before it kills a call that ran out of time
it has the worker dump its stacks (faulthandler, `stack_dumps`), so the timeout's message says
where the call was stuck: `no result after 30 s; stuck at File "my_reward.py", line 12 in score`.
Workers say "ready" when the handler is
loaded, so start-up never counts against a job; a worker that cannot start (or does not within
`start_timeout_s`) breaks the pool: every job then resolves `pool_broken`, and nothing hangs.
Used for scorers (`process_pool.ScoringPool`) and for tools (`stratarl.agent.tools.isolation`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from stratarl.observe.stack_dumps import DUMP_SIGNAL, main_thread_frames, wait_for_dump
from stratarl.reward.call_worker import CallResult

WORKER_COMMAND = "import sys; from stratarl.reward.call_worker import main; main(sys.argv)"
STACK_WAIT_S = 1.0  # how long a timed-out worker may take to write its stacks before it is killed


@dataclass
class _Slot:
    """One worker process and the job it runs (None when idle)."""

    process: subprocess.Popen
    conn: Connection
    started_at: float
    stack_path: Path
    future: Future | None = None
    job_started: float = 0.0
    is_ready: bool = False  # the worker said "ready": the handler is loaded


class CallPool:
    """K worker processes running the picklable `handler(job)`; `timeout_s` per job."""

    def __init__(
        self,
        handler: Any,
        *,
        num_workers: int = 2,
        timeout_s: float = 30.0,
        max_output_bytes: int = 4096,
        start_timeout_s: float = 120.0,
        name: str = "call-pool",
    ) -> None:
        if num_workers < 1 or timeout_s <= 0:
            message = f"{name} needs num_workers >= 1 and timeout_s > 0, got {num_workers} and {timeout_s}"
            raise ValueError(message)
        try:
            self._payload = pickle.dumps(handler)
        except Exception as err:
            raise TypeError(f"{name}: {handler!r} cannot be sent to worker processes: {err}") from err
        self.timeout_s, self.start_timeout_s = timeout_s, start_timeout_s
        self.max_output_bytes = max_output_bytes
        self.name = name
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._queue: deque[tuple[Any, Future]] = deque()
        self._closed = False
        self.restarts = 0
        self.broken: str | None = None  # why the pool stopped by itself (a worker could not start)
        self._stack_dir = Path(tempfile.mkdtemp(prefix=f"stratarl-{name}-"))  # the workers' stack dumps
        self._worker_ids = itertools.count()
        self._slots = [self._start_worker() for _ in range(num_workers)]
        self._dispatcher = threading.Thread(target=self._dispatch, name=name, daemon=True)
        self._dispatcher.start()

    def submit(self, job: Any) -> Future:
        """Queue one job; the future resolves to a `CallResult` (never to an exception)."""
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(self.broken or f"{self.name} is closed")
            self._queue.append((job, future))
        self._wake.set()
        return future

    def close(self) -> None:
        """Stop the dispatcher and the workers; queued jobs resolve as `pool_closed`."""
        with self._lock:
            self._closed = True
        self._wake.set()
        self._dispatcher.join(timeout=10)
        for slot in self._slots:
            _kill(slot)
        shutil.rmtree(self._stack_dir, ignore_errors=True)

    def __enter__(self) -> CallPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- dispatcher thread -------------------------------------------------------------------
    def _start_worker(self) -> _Slot:
        parent, child = socket.socketpair()
        with child:
            process = subprocess.Popen(
                [sys.executable, "-c", WORKER_COMMAND, str(child.fileno())],
                pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: killed with whatever user code started
            )
        conn = Connection(parent.detach())
        stack_path = self._stack_dir / f"worker-{next(self._worker_ids)}.txt"
        setup = {
            "sys_path": list(sys.path),
            "max_output_bytes": self.max_output_bytes,
            "stack_path": str(stack_path),
        }
        try:
            conn.send(setup)
            conn.send_bytes(self._payload)
        except OSError:  # it died at once: _reap reports the failed start
            process.wait(timeout=5)
        return _Slot(process, conn, started_at=time.monotonic(), stack_path=stack_path)

    def _dispatch(self) -> None:
        """The pool's one thread. Should it ever fail, the pool breaks and every job resolves: a
        caller waiting on a future must never wait forever."""
        try:
            self._run()
        except BaseException as err:
            self._break(f"{self.name} stopped: {type(err).__name__}: {err}")
            self._drain_closed()

    def _run(self) -> None:
        while True:
            with self._lock:
                closed = self._closed
            if closed:
                self._drain_closed()
                return
            self._assign_idle()
            watched = {s.conn: s for s in self._slots if s.future is not None or not s.is_ready}
            ready = wait(list(watched), timeout=0.02) if watched else []
            for conn in ready:
                self._receive(watched[conn])
            self._reap(time.monotonic())
            if not watched:
                self._wake.wait(0.05)
                self._wake.clear()

    def _assign_idle(self) -> None:
        for slot in self._slots:
            if slot.future is not None or not slot.is_ready:
                continue
            with self._lock:
                if not self._queue:
                    return
                job, future = self._queue.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            with contextlib.suppress(OSError, ValueError):  # died while idle: _reap replaces it
                slot.conn.send(job)
            slot.future, slot.job_started = future, time.monotonic()

    def _receive(self, slot: _Slot) -> None:
        try:
            message = slot.conn.recv()
        except (EOFError, OSError):
            slot.process.poll()  # it died: _reap sees the exit code
            return
        if isinstance(message, tuple) and message[0] == "setup_failed":
            self._break(f"a worker of {self.name} failed to start: {message[1]}")
        elif isinstance(message, tuple) and message[0] == "ready":
            slot.is_ready = True
        elif slot.future is not None:
            future, slot.future = slot.future, None
            future.set_result(message)

    def _reap(self, now: float) -> None:
        """Replace workers that overran their job's deadline or ended; break on a failed start."""
        for i, slot in enumerate(self._slots):
            ended = slot.process.poll() is not None
            if slot.future is None:
                if not slot.is_ready and (ended or now - slot.started_at > self.start_timeout_s):
                    why = f"exit code {slot.process.returncode}" if ended else "not ready in time"
                    self._break(f"a worker of {self.name} failed to start ({why})")
                elif ended:  # died while idle (e.g. a thread user code left behind called os._exit)
                    self._slots[i] = self._replace(slot)
                continue
            overran = now - slot.job_started > self.timeout_s
            if not overran and not ended:
                continue
            where = _stuck_at(slot) if overran and not ended else []
            _kill(slot)
            future = slot.future
            self._slots[i] = self._replace(slot)
            future.set_result(_ended_result(slot.process.returncode, overran, self.timeout_s, where))

    def _replace(self, slot: _Slot) -> _Slot:
        _kill(slot)
        self.restarts += 1
        return self._start_worker()

    def _break(self, why: str) -> None:
        with self._lock:
            self.broken = self.broken or why
            self._closed = True

    def _drain_closed(self) -> None:
        reason = "pool_broken" if self.broken else "pool_closed"
        message = self.broken or f"{self.name} closed"
        for slot in self._slots:
            if slot.future is not None:
                slot.future.set_result(CallResult(reason=reason, message=message))
                slot.future = None
        with self._lock:
            queued, self._queue = list(self._queue), deque()
        for _, future in queued:
            if future.set_running_or_notify_cancel():
                future.set_result(CallResult(reason=reason, message=message))


def _stuck_at(slot: _Slot) -> list[str]:
    """The innermost frames of the call a worker is still running (it writes its stacks on
    SIGUSR1); [] when it does not answer within STACK_WAIT_S."""
    size = slot.stack_path.stat().st_size if slot.stack_path.exists() else 0
    try:
        os.kill(slot.process.pid, DUMP_SIGNAL)
    except OSError:
        return []
    if not wait_for_dump(slot.stack_path, size, timeout_s=STACK_WAIT_S):
        return []
    with slot.stack_path.open(encoding="utf-8", errors="replace") as f:
        f.seek(size)
        return main_thread_frames(f.read(), depth=2)


def _ended_result(returncode: int | None, overran: bool, timeout_s: float, where: list[str]) -> CallResult:
    if overran:
        stuck = f"; stuck at {' <- '.join(where)}" if where else ""
        return CallResult(reason="timeout", message=f"no result after {timeout_s:g} s{stuck}")
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return CallResult(reason="process_crash", message=f"killed by {name}")
    return CallResult(reason="process_exit", message=f"the process exited with code {returncode}")


def _kill(slot: _Slot) -> None:
    """SIGKILL the worker's process group (it and anything user code started) and reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(slot.process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        slot.process.wait(timeout=5)
    slot.conn.close()
