"""Layer 5, agent loops: tools and interactions run under deadlines that no user code can escape.

A tool is user code: it may block in `time.sleep`, swallow `CancelledError`, raise `SystemExit`,
call `os._exit` or crash. The event loop of the agent never runs it directly:

- `ProcessToolRunner` (the trainer's default): each call (create → execute → release) runs in a
  worker process of a `CallPool`; a call still running at `tool_timeout_s` is killed with its
  worker, which is replaced. Nothing a tool does reaches the trainer's process.
- `ThreadToolRunner` (`agent.tools_in_process`, and code that builds a runner itself): each call
  runs on an event loop of its own in a daemon thread, and the episode stops waiting at the
  deadline. Blocking, swallowed cancellation and SystemExit are contained; `os._exit`, a crash
  or a loop that never yields are not (the abandoned thread keeps running).
- `InteractionRunner`: interactions keep per-episode state between calls, so they run on one
  long-lived event loop in a thread of their own, each call under `interaction_timeout_s`; after
  a timeout a fresh loop thread takes over (the stuck one is abandoned).

A call that fails this way raises `CallFailure(reason, message)`; the session records it as the
call's error and as a `tool_<reason>` / `interaction_<reason>` failure of the episode.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any

from stratarl.agent.tools.base import Tool, ToolResult
from stratarl.reward.call_pool import CallPool
from stratarl.reward.call_worker import describe

# Reasons of a call that did not end by returning or by raising an ordinary exception.
FAILURE_REASONS = frozenset(
    {
        "timeout",
        "SystemExit",
        "KeyboardInterrupt",
        "CancelledError",
        "process_exit",
        "process_crash",
        "worker_broken",  # it wrote bytes that are not a message to its socket, or closed it
        "bad_return",  # what it returned cannot travel back (or be unpickled in the trainer)
        "pool_broken",
        "pool_closed",
    }
)


class CallFailure(Exception):
    """A tool or interaction call that timed out, exited, crashed, or could not be run."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason, self.message = reason, message


async def use_tool(
    tool: Tool, create_kwargs: dict[str, Any], arguments: dict[str, Any], context: dict
) -> ToolResult:
    """One call of a tool: create an instance, execute it, release it."""
    instance_id = await tool.create(None, **create_kwargs)
    try:
        return await tool.execute(instance_id, arguments, **context)
    finally:
        await tool.release(instance_id)


class ToolCallHandler:
    """The job handler of a tool worker process: (tool name, create kwargs, arguments, trajectory) →
    `ToolResult`. The tools travel pickled; each worker holds its own copies."""

    def __init__(self, tools: dict[str, Tool]) -> None:
        self.tools = tools

    def __call__(self, job: tuple) -> ToolResult:
        name, create_kwargs, arguments, trajectory = job
        return asyncio.run(use_tool(self.tools[name], create_kwargs, arguments, {"trajectory": trajectory}))


class ProcessToolRunner:
    """Tool calls in `num_workers` worker processes, each under `timeout_s`."""

    def __init__(
        self, tools: dict[str, Tool], *, num_workers: int, timeout_s: float, max_output_bytes: int
    ) -> None:
        self.timeout_s = timeout_s
        self.pool = CallPool(
            ToolCallHandler(tools),
            num_workers=num_workers,
            timeout_s=timeout_s,
            max_output_bytes=max_output_bytes,
            name="tool-pool",
        )

    async def run(
        self, tool: Tool, create_kwargs: dict[str, Any], arguments: dict[str, Any], context: dict
    ) -> ToolResult:
        job = (tool.name, create_kwargs, arguments, context.get("trajectory"))
        result = await asyncio.wrap_future(self.pool.submit(job))
        if result.reason is None:
            return result.value
        if result.reason in FAILURE_REASONS:
            raise CallFailure(result.reason, _message(result.reason, result.message, self.timeout_s))
        raise ToolError(result.message)

    def close(self) -> None:
        self.pool.close()


class ToolError(Exception):
    """An ordinary exception a tool raised in a worker process; its text is "<Class>: <message>"."""


class ThreadToolRunner:
    """Tool calls on event loops of their own in daemon threads, each awaited up to `timeout_s`."""

    def __init__(self, *, timeout_s: float) -> None:
        self.timeout_s = timeout_s

    async def run(
        self, tool: Tool, create_kwargs: dict[str, Any], arguments: dict[str, Any], context: dict
    ) -> ToolResult:
        return await run_in_thread(lambda: use_tool(tool, create_kwargs, arguments, context), self.timeout_s)

    def close(self) -> None:
        pass


async def run_in_thread(make: Callable[[], Awaitable[Any]], timeout_s: float) -> Any:
    """`await make()` on a fresh event loop in a daemon thread; stop waiting at `timeout_s`."""
    future: Future = Future()

    def target() -> None:
        try:
            value = asyncio.run(_awaited(make))
        except BaseException as err:  # SystemExit and CancelledError too: reported, never raised here
            _settle(future, (False, err))
        else:
            _settle(future, (True, value))

    threading.Thread(target=target, daemon=True, name="tool-call").start()
    return _unwrap(await _wait(future, timeout_s), timeout_s)


class InteractionRunner:
    """Interaction calls on one long-lived event loop in its own thread, each under `timeout_s`."""

    def __init__(self, *, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None or self._loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, daemon=True, name="interactions").start()
            self._loop = loop
        return self._loop

    async def run(self, make: Callable[[], Awaitable[Any]]) -> Any:
        loop = self._ensure_loop()
        future: Future = Future()

        async def call() -> None:
            try:
                value = await make()
            except BaseException as err:
                _settle(future, (False, err))
            else:
                _settle(future, (True, value))

        loop.call_soon_threadsafe(lambda: loop.create_task(call()))
        try:
            return _unwrap(await _wait(future, self.timeout_s), self.timeout_s)
        except CallFailure as failure:
            if failure.reason == "timeout":  # the loop may be blocked: later calls get a fresh one
                self._loop = None
            raise

    def close(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop = None


async def _awaited(make: Callable[[], Awaitable[Any]]) -> Any:
    return await make()


async def _wait(future: Future, timeout_s: float) -> tuple[bool, Any] | None:
    """(returned, value or what it raised), or None at the deadline (the call is left to finish or
    not). What a call raised travels as a value: a SystemExit set on a future that asyncio awaits
    would be re-raised out of the event loop, ending the run."""
    try:
        return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), timeout=timeout_s)
    except asyncio.TimeoutError:
        return None


def _unwrap(outcome: tuple[bool, Any] | None, timeout_s: float) -> Any:
    if outcome is None:
        raise CallFailure("timeout", _message("timeout", "", timeout_s))
    returned, value = outcome
    if returned:
        return value
    if isinstance(value, Exception) and not isinstance(value, asyncio.CancelledError):
        raise value
    raise CallFailure(type(value).__name__, describe(value))  # SystemExit, CancelledError, ...


def _settle(future: Future, outcome: tuple[bool, Any]) -> None:
    if not future.done():
        future.set_result(outcome)


def _message(reason: str, message: str, timeout_s: float) -> str:
    return f"timed out after {timeout_s:g} s" if reason == "timeout" else message
