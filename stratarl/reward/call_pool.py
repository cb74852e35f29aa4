"""Layer 5, rewards: user code in K worker processes, each call under a deadline nothing can escape.

Python cannot stop a thread, and a call may block in C, swallow every exception, exit the process
or crash it; only a process boundary contains all of these. `CallPool(handler)` starts K workers
(`call_worker`, plain `python -c` processes: no re-import of the trainer's main module, no fork of
a process holding torch threads). A dispatcher thread hands one job at a time to each idle worker
and starts that job's clock when the worker takes it; a worker still busy after `timeout_s`, or
one that ended, is killed with its whole process group and replaced, and its job resolves with
reason `timeout`, `process_exit` or `process_crash`. The dispatcher never blocks on a worker: it
reads only what a socket already holds (`call_frames.FrameReader`), so a worker that wrote half a
message still times out at its job's deadline, and it sends with a deadline too; a worker that
sends bytes that are not a frame or closes its socket is `worker_broken`, killed and replaced. A
returned value the trainer cannot unpickle fails that one call (`bad_return`). Each worker is
isolated from the trainer as `worker_isolation` says (a PID namespace where bubblewrap can make
one), and all workers are started by the dispatcher thread, whose life their parent-death signal
follows. Before it kills a call that ran out of time it has the worker dump its stacks
(faulthandler, `stack_dumps`), so the timeout's message says where the call was stuck:
`no result after 30 s; stuck at File "my_reward.py", line 12 in score`. Workers say "ready" when
the handler is loaded, so start-up never counts against a job; a worker that cannot start (or
does not within `start_timeout_s`) breaks the pool: every job then resolves `pool_broken`, and
nothing hangs.
Used for scorers (`process_pool.ScoringPool`) and for tools (`stratarl.agent.isolation`).
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
import select
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
from pathlib import Path
from typing import Any

from stratarl.observe.stack_dumps import DUMP_SIGNAL, main_thread_frames, wait_for_dump
from stratarl.reward.call_frames import FrameError, FrameReader, send_frame
from stratarl.reward.call_worker import CallResult, describe
from stratarl.reward.worker_isolation import (
    ended_reason,
    kill_worker,
    pid_namespace_problem,
    start_worker,
)

log = logging.getLogger(__name__)

WORKER_COMMAND = "import sys; from stratarl.reward.call_worker import main; main(sys.argv)"
STACK_WAIT_S = 1.0  # how long a timed-out worker may take to write its stacks before it is killed
CLOSE_GRACE_S = 1.0  # a worker whose socket closed this long ago and still runs is broken, not exiting


@dataclass
class _Slot:
    """One worker process and the job it runs (None when idle)."""

    process: subprocess.Popen  # the worker, or bwrap around it
    sock: socket.socket
    started_at: float
    stack_path: Path
    worker_pid: int  # the worker's pid as the trainer sees it (signalled for its stacks)
    reader: FrameReader
    future: Future | None = None
    job_started: float = 0.0
    is_ready: bool = False  # the worker said "ready": the handler is loaded
    broken: str | None = None  # why the worker can no longer be talked to (killed and replaced)
    closed_at: float | None = None  # when its socket reached its end (it exits, or user code closed it)


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
        self.num_workers = num_workers
        self.isolation_problem = pid_namespace_problem()  # None: each worker in its own PID namespace
        if self.isolation_problem is not None:
            log.warning("%s: workers run without a PID namespace (%s)", name, self.isolation_problem)
        self._slots: list[_Slot] = []  # started by the dispatcher thread, whose life they follow
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
        command = [sys.executable, "-c", WORKER_COMMAND, str(child.fileno())]
        with child:
            process, worker_pid = start_worker(
                command, child.fileno(), in_namespace=self.isolation_problem is None
            )
        stack_path = self._stack_dir / f"worker-{next(self._worker_ids)}.txt"
        setup = {
            "sys_path": list(sys.path),
            "max_output_bytes": self.max_output_bytes,
            "stack_path": str(stack_path),
        }
        slot = _Slot(process, parent, time.monotonic(), stack_path, worker_pid, FrameReader())
        self._send(slot, pickle.dumps(setup), self.start_timeout_s)
        self._send(slot, self._payload, self.start_timeout_s)
        return slot

    def _send(self, slot: _Slot, data: bytes, timeout_s: float) -> None:
        """One frame to a worker, waiting at most `timeout_s` for it to take the bytes."""
        slot.sock.settimeout(timeout_s)
        try:
            send_frame(slot.sock, data)
        except TimeoutError:
            slot.broken = f"took no input for {timeout_s:g} s"
        except OSError:  # it died: _reap sees the exit code
            slot.process.poll()

    def _dispatch(self) -> None:
        """The pool's one thread. Should it ever fail, the pool breaks and every job resolves: a
        caller waiting on a future must never wait forever."""
        try:
            self._run()
        except BaseException as err:
            self._break(f"{self.name} stopped: {type(err).__name__}: {err}")
            self._drain_closed()

    def _run(self) -> None:
        for _ in range(self.num_workers):
            self._slots.append(self._start_worker())
        while True:
            with self._lock:
                closed = self._closed
            if closed:
                self._drain_closed()
                return
            self._assign_idle()
            watched = {
                s.sock: s
                for s in self._slots
                if (s.future is not None or not s.is_ready) and not s.broken and s.closed_at is None
            }
            for sock in _readable(list(watched), timeout_s=0.02):
                self._receive(watched[sock])
            self._reap(time.monotonic())
            if not watched:
                self._wake.wait(0.05)
                self._wake.clear()

    def _assign_idle(self) -> None:
        for slot in self._slots:
            if slot.future is not None or not slot.is_ready or slot.broken:
                continue
            with self._lock:
                if not self._queue:
                    return
                job, future = self._queue.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            slot.future, slot.job_started = future, time.monotonic()
            try:
                data = pickle.dumps(job)
            except Exception as err:
                slot.future = None
                future.set_result(CallResult(reason="bad_job", message=f"cannot be sent: {describe(err)}"))
                continue
            self._send(slot, data, self.timeout_s)  # its clock runs: a worker that takes nothing times out

    def _receive(self, slot: _Slot) -> None:
        """Read what the socket holds (never more), and act on each whole message in it."""
        try:
            data = slot.sock.recv(65536, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # closed: the worker is ending (_reap sees the exit code) or user code closed it
            slot.closed_at = time.monotonic()
            return
        try:
            frames = slot.reader.feed(data)
        except FrameError as err:
            slot.broken = f"sent bytes that are not a message ({err})"
            return
        for frame in frames:
            self._handle(slot, frame)

    def _handle(self, slot: _Slot, frame: bytes) -> None:
        try:
            kind, *body = pickle.loads(frame)
            result = _result(*body) if kind == "result" else None
        except Exception as err:  # not what a worker sends: user code wrote to the socket
            slot.broken = f"sent a message that cannot be read: {describe(err)}"
            return
        if kind == "setup_failed":
            self._break(f"a worker of {self.name} failed to start: {body[0]}")
        elif kind == "ready":
            slot.is_ready = True
        elif result is not None and slot.future is not None:
            future, slot.future = slot.future, None
            future.set_result(result)

    def _reap(self, now: float) -> None:
        """Replace workers that overran their job's deadline, ended or broke; break on a failed start."""
        for i, slot in enumerate(self._slots):
            ended = slot.process.poll() is not None
            if slot.closed_at is not None and not ended and now - slot.closed_at > CLOSE_GRACE_S:
                slot.broken = slot.broken or "closed its socket"
            if slot.future is None:
                self._reap_idle(i, slot, ended, now)
                continue
            overran = now - slot.job_started > self.timeout_s
            if not (overran or ended or slot.broken):
                continue
            where = _stuck_at(slot) if overran and not ended else []
            _kill(slot)
            future = slot.future
            self._slots[i] = self._replace(slot)
            if slot.broken and not overran and slot.process.returncode == -signal.SIGKILL:  # we killed it
                future.set_result(CallResult(reason="worker_broken", message=f"the worker {slot.broken}"))
                continue
            in_namespace = self.isolation_problem is None
            result = _ended_result(
                slot.process.returncode, overran, self.timeout_s, where, in_namespace=in_namespace
            )
            if overran and slot.reader.partial_bytes:
                result.message += f"; it had sent {slot.reader.partial_bytes} bytes of an unfinished message"
            future.set_result(result)

    def _reap_idle(self, i: int, slot: _Slot, ended: bool, now: float) -> None:
        if not slot.is_ready:
            late = now - slot.started_at > self.start_timeout_s
            if ended or slot.broken or late:
                why = f"exit code {slot.process.returncode}" if ended else slot.broken or "not ready in time"
                self._break(f"a worker of {self.name} failed to start ({why})")
        elif ended or slot.broken:  # e.g. a thread user code left behind called os._exit
            self._slots[i] = self._replace(slot)

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


def _readable(socks: list[socket.socket], timeout_s: float) -> list[socket.socket]:
    """The sockets with bytes (or an end) to read, waiting at most `timeout_s` (poll, not select:
    a trainer holds descriptors above select's 1024)."""
    if not socks:
        return []
    poller = select.poll()
    by_fd = {sock.fileno(): sock for sock in socks}
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    return [by_fd[fd] for fd, _ in poller.poll(timeout_s * 1000)]


def _result(fields: dict, value: bytes) -> CallResult:
    """A result message as a `CallResult`; a value that cannot be unpickled here fails this call."""
    result = CallResult(**fields)
    if result.reason is None:
        try:
            result.value = pickle.loads(value)
        except Exception as err:
            result.reason = "bad_return"
            result.message = f"the result cannot be unpickled in the trainer: {describe(err)}"[:300]
    return result


def _stuck_at(slot: _Slot) -> list[str]:
    """The innermost frames of the call a worker is still running (it writes its stacks on
    SIGUSR1); [] when it does not answer within STACK_WAIT_S."""
    size = slot.stack_path.stat().st_size if slot.stack_path.exists() else 0
    try:
        os.kill(slot.worker_pid, DUMP_SIGNAL)
    except OSError:
        return []
    if not wait_for_dump(slot.stack_path, size, timeout_s=STACK_WAIT_S):
        return []
    with slot.stack_path.open(encoding="utf-8", errors="replace") as f:
        f.seek(size)
        return main_thread_frames(f.read(), depth=2)


def _ended_result(
    returncode: int | None, overran: bool, timeout_s: float, where: list[str], *, in_namespace: bool
) -> CallResult:
    if overran:
        stuck = f"; stuck at {' <- '.join(where)}" if where else ""
        return CallResult(reason="timeout", message=f"no result after {timeout_s:g} s{stuck}")
    reason, message = ended_reason(returncode, in_namespace=in_namespace)
    return CallResult(reason=reason, message=message)


def _kill(slot: _Slot) -> None:
    kill_worker(slot.process)
    slot.sock.close()
