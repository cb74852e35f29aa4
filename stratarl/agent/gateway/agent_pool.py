"""Layer 5, agent gateway: the agent program in contained worker processes, many episodes in each.

An agent is user code: it may block its event loop, swallow cancellation, call `os._exit`, crash,
or signal its parent. `AgentPool` runs it in `num_workers` processes (`agent_worker`), each
started as the scorer and tool workers are (`stratarl.reward.worker_isolation`: a PID namespace of
its own under bubblewrap where it can be made, a session of its own, dying with the trainer), and
each running many episodes at once on its own event loop. The trainer's memory and event loop are
out of reach; the network is shared (the PID namespace is the only one unshared), which is what
lets the agent reach the gateway on 127.0.0.1 — and whatever else the trainer's host can reach.

The pool's own thread runs an event loop that starts the workers (their parent-death signal
follows it, and it lives as long as the pool), sends each episode to the worker with the fewest
running, and reads their answers (`call_frames`, never a read without a deadline). An episode
resolves as one `EpisodeOutcome`: the worker's own answer ("done", "timeout" at `timeout_s`,
"error"), or, when its worker cannot answer:
- no answer `grace_s` after its deadline (the worker's loop is blocked: `time.sleep`, a C call, a
  loop that never yields): the worker's stacks are dumped, it is killed with everything it
  started, and each of its running episodes resolves "timeout" with where the loop was stuck;
- its worker ended (`os._exit`, a signal, a socket it broke): each of its running episodes
  resolves "crash" with the exit code or signal.
A lost worker is replaced; one that cannot start breaks the pool, and every episode then
resolves "error" with why — nothing waits forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stratarl.agent.gateway.agent_program import AgentProgramError
from stratarl.agent.gateway.agent_worker import WORKER_COMMAND
from stratarl.agent.gateway.episodes import EpisodeOutcome
from stratarl.observe.stack_dumps import DUMP_SIGNAL, main_thread_frames, wait_for_dump
from stratarl.reward.call_frames import HEADER, FrameReader
from stratarl.reward.call_worker import describe
from stratarl.reward.worker_isolation import ended_reason, kill_worker, pid_namespace_problem, start_worker

log = logging.getLogger(__name__)

GRACE_S = 5.0  # past an episode's deadline, how long its worker may take to say "timeout" itself
SEND_TIMEOUT_S = 30.0  # how long a worker may take to accept one episode's message
STACK_WAIT_S = 1.0  # how long a blocked worker may take to write its stacks before it is killed
EXIT_WAIT_S = 1.0  # after its socket ends, how long a worker may take to exit before it is killed


@dataclass(eq=False)
class _Worker:
    process: subprocess.Popen  # the worker, or bwrap around it
    pid: int  # the worker's pid as the trainer sees it (signalled for its stacks)
    writer: asyncio.StreamWriter
    reader: asyncio.StreamReader
    stack_path: Path
    ready: asyncio.Future  # True once the agent is loaded; AgentProgramError when it cannot be
    running: dict[int, asyncio.Future] = field(default_factory=dict)  # episode number -> its outcome
    listener: asyncio.Task | None = None
    killing: asyncio.Task | None = None  # the kill of a blocked worker, awaited by all its late episodes
    lost: bool = False


class AgentPool:
    """`await pool.run(base_url, api_key, row)` -> `EpisodeOutcome`, from any thread's event loop."""

    def __init__(
        self,
        agent_path: str,
        agent_name: str,
        *,
        num_workers: int,
        timeout_s: float,
        grace_s: float = GRACE_S,
        start_timeout_s: float = 120.0,
    ) -> None:
        if num_workers < 1 or timeout_s <= 0:
            raise ValueError(f"AgentPool needs num_workers >= 1, timeout_s > 0: {num_workers}, {timeout_s}")
        self.agent_path, self.agent_name = agent_path, agent_name
        self.num_workers, self.timeout_s, self.grace_s = num_workers, timeout_s, grace_s
        self.start_timeout_s = start_timeout_s
        self.isolation_problem = pid_namespace_problem()  # None: each worker in its own PID namespace
        if self.isolation_problem is not None:
            log.warning("agent workers run without a PID namespace (%s)", self.isolation_problem)
        self.restarts = 0
        self.broken: str | None = None
        self._workers: list[_Worker] = []
        self._replacing: asyncio.Task | None = None
        self._numbers = itertools.count()
        self._stack_dir = Path(tempfile.mkdtemp(prefix="stratarl-agent-pool-"))
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="agent-pool", daemon=True)
        self._thread.start()
        try:
            self._call(self._start_all()).result()
        except BaseException:
            self.close()
            raise

    # --- the caller's side (any thread) ------------------------------------------------------
    @property
    def live_workers(self) -> int:
        return sum(not w.lost for w in self._workers)

    async def run(self, base_url: str, api_key: str, row: dict[str, Any]) -> EpisodeOutcome:
        return await asyncio.wrap_future(self._call(self._episode(base_url, api_key, row)))

    def close(self) -> None:
        """Kill every worker (and what it started); running episodes resolve as "error"."""
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                self._call(self._lose_all("was stopped (the agent pool closed)")).result(timeout=30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()
        shutil.rmtree(self._stack_dir, ignore_errors=True)

    def __enter__(self) -> AgentPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    # --- the pool's thread -------------------------------------------------------------------
    async def _start_all(self) -> None:
        starts = [self._start() for _ in range(self.num_workers)]
        workers = await asyncio.gather(*starts, return_exceptions=True)
        self._workers = [w for w in workers if isinstance(w, _Worker)]
        failure = next((w for w in workers if isinstance(w, BaseException)), None)
        if failure is not None:
            raise failure

    async def _start(self) -> _Worker:
        """One worker with the agent loaded; AgentProgramError (the key and the file) when it cannot be.
        Started on this thread, and not in another: the worker's parent-death signal follows it."""
        parent, child = socket.socketpair()
        command = [sys.executable, "-c", WORKER_COMMAND, str(child.fileno())]
        with child:
            process, pid = start_worker(command, child.fileno(), in_namespace=self.isolation_problem is None)
        parent.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=parent)
        stack_path = self._stack_dir / f"worker-{pid}-{next(self._numbers)}.txt"
        worker = _Worker(process, pid, writer, reader, stack_path, self._loop.create_future())
        worker.listener = asyncio.create_task(self._listen(worker))
        setup = {
            "sys_path": list(sys.path),
            "agent_path": self.agent_path,
            "agent_name": self.agent_name,
            "stack_path": str(stack_path),
        }
        try:
            await self._send(worker, pickle.dumps(setup))
            await asyncio.wait_for(asyncio.shield(worker.ready), self.start_timeout_s)
        except BaseException as err:
            await self._lose(worker, "did not start", replace=False)  # a no-op if its listener lost it
            if isinstance(err, AgentProgramError | asyncio.CancelledError):
                raise
            if isinstance(err, TimeoutError):
                raise AgentProgramError(
                    f"agent.gateway.agent_function_path: the agent worker did not load {self.agent_path} "
                    f"within {self.start_timeout_s:g} s"
                ) from err
            raise AgentProgramError(
                f"agent.gateway.agent_function_path: the agent worker for {self.agent_path} failed to "
                f"start: {describe(err)}"
            ) from err
        return worker

    async def _send(self, worker: _Worker, data: bytes) -> None:
        worker.writer.write(HEADER.pack(len(data)) + data)
        await asyncio.wait_for(worker.writer.drain(), SEND_TIMEOUT_S)

    async def _episode(self, base_url: str, api_key: str, row: dict[str, Any]) -> EpisodeOutcome:
        try:
            worker = await self._choose()
        except AgentProgramError as err:
            return EpisodeOutcome("error", error=f"no agent worker: {err}"[:300])
        number = next(self._numbers)
        try:
            message = pickle.dumps(("episode", number, base_url, api_key, row, self.timeout_s))
        except Exception as err:
            return EpisodeOutcome("error", error=f"the row cannot be sent to a worker: {describe(err)}")
        outcome = worker.running[number] = self._loop.create_future()
        try:
            await self._send(worker, message)
        except (OSError, TimeoutError) as err:  # the worker is going: its listener resolves the episode
            await self._lose(worker, f"took no episode ({describe(err)})", status="crash")
        try:
            return await asyncio.wait_for(asyncio.shield(outcome), self.timeout_s + self.grace_s)
        except TimeoutError:  # the worker did not answer for its deadline: its loop is blocked
            if worker.killing is None:
                worker.killing = asyncio.create_task(self._kill_blocked(worker))
            await asyncio.shield(worker.killing)
            if not outcome.done():  # its worker was already lost, and resolved what it then ran
                outcome.set_result(EpisodeOutcome("timeout", error=f"no answer after {self.timeout_s:g} s"))
            return outcome.result()
        finally:
            worker.running.pop(number, None)

    async def _kill_blocked(self, worker: _Worker) -> None:
        stuck = await asyncio.to_thread(self._stuck_at, worker)
        where = f"; stuck at {' <- '.join(stuck)}" if stuck else ""
        why = f"answered nothing {self.grace_s:g} s past the deadline (its event loop is blocked{where})"
        await self._lose(worker, why, status="timeout")

    async def _choose(self) -> _Worker:
        """The live worker with the fewest running episodes (waiting for a replacement if none)."""
        while True:
            if self.broken or self._closed:
                raise AgentProgramError(self.broken or "the agent pool is closed")
            live = [w for w in self._workers if not w.lost]
            if live:
                return min(live, key=lambda w: len(w.running))
            if self._replacing is None or self._replacing.done():
                self._replacing = asyncio.create_task(self._replace())
            await asyncio.shield(self._replacing)

    async def _replace(self) -> None:
        while len([w for w in self._workers if not w.lost]) < self.num_workers and not self._closed:
            try:
                worker = await self._start()
            except Exception as err:
                self.broken = f"an agent worker could not be restarted: {err}"
                log.error("%s", self.broken)
                return
            self._workers.append(worker)
            self.restarts += 1

    async def _listen(self, worker: _Worker) -> None:
        """Act on each message of the worker; at its socket's end (or bytes that are not a
        message), lose it."""
        frames, why = FrameReader(), "closed its socket"
        while True:
            try:
                data = await worker.reader.read(65536)
            except OSError:
                data = b""
            if not data:
                break
            try:
                for frame in frames.feed(data):
                    self._handle(worker, frame)
            except Exception as err:  # FrameError, or a frame that is no message of ours: user code wrote it
                why = f"sent bytes that are not a message ({describe(err)})"
                break
        for _ in range(int(EXIT_WAIT_S / 0.01)):  # a worker ending by itself: wait for its exit code
            if worker.process.poll() is not None:
                break
            await asyncio.sleep(0.01)
        if worker.process.poll() is not None:
            ended = ended_reason(worker.process.returncode, in_namespace=self.isolation_problem is None)
            why = f"ended ({ended[1]})"
        await self._lose(worker, why, status="crash")

    def _handle(self, worker: _Worker, frame: bytes) -> None:
        kind, *body = pickle.loads(frame)
        if kind == "ready":
            if not worker.ready.done():
                worker.ready.set_result(True)
        elif kind == "setup_failed":
            if not worker.ready.done():
                worker.ready.set_exception(AgentProgramError(str(body[0])))
        elif kind == "result":
            number, status, message, value = body
            outcome = worker.running.get(number)
            if outcome is not None and not outcome.done():
                outcome.set_result(_outcome(status, message, value))
        else:
            raise ValueError(f"unknown message {kind!r}")

    async def _lose(self, worker: _Worker, why: str, *, status: str = "crash", replace: bool = True) -> None:
        """Kill `worker`; each of its running episodes resolves with `status` and why."""
        if worker.lost:
            return
        worker.lost = True
        if worker.listener is not None and worker.listener is not asyncio.current_task():
            worker.listener.cancel()
        await asyncio.to_thread(kill_worker, worker.process)
        worker.writer.close()
        if not worker.ready.done():
            worker.ready.set_exception(
                AgentProgramError(f"agent.gateway.agent_function_path: the agent worker {why}")
            )
        count = len(worker.running)
        for outcome in worker.running.values():
            if not outcome.done():
                message = f"its agent worker {why} while it ran; the {count} episode(s) in that worker ended"
                outcome.set_result(EpisodeOutcome(status, error=message[:500]))
        if worker in self._workers:
            self._workers.remove(worker)
        started = worker.ready.exception() is None  # a worker that never started is not replaced
        if replace and started and not self._closed and (self._replacing is None or self._replacing.done()):
            self._replacing = asyncio.create_task(self._replace())

    async def _lose_all(self, why: str) -> None:
        self._closed = True
        for worker in list(self._workers):
            await self._lose(worker, why, status="error", replace=False)
        if self._replacing is not None:
            self._replacing.cancel()
            await asyncio.gather(self._replacing, return_exceptions=True)
        await asyncio.sleep(0)  # the cancelled listeners end before the loop stops

    def _stuck_at(self, worker: _Worker) -> list[str]:
        """The innermost frames of the worker's main thread (its event loop), [] without an answer."""
        size = worker.stack_path.stat().st_size if worker.stack_path.exists() else 0
        try:
            os.kill(worker.pid, DUMP_SIGNAL)
        except OSError:
            return []
        if not wait_for_dump(worker.stack_path, size, timeout_s=STACK_WAIT_S):
            return []
        with worker.stack_path.open(encoding="utf-8", errors="replace") as f:
            f.seek(size)
            return main_thread_frames(f.read(), depth=2)


def _outcome(status: str, message: str, value: bytes) -> EpisodeOutcome:
    if status != "done":
        return EpisodeOutcome(status, error=message)
    try:
        return EpisodeOutcome("done", value=pickle.loads(value))
    except Exception as err:
        return EpisodeOutcome("error", error=f"the returned value cannot be unpickled here: {describe(err)}")
