"""Layer 5, agent gateway: the worker process of an `agent_pool.AgentPool` — many episodes, one loop.

Started as `python -c ... FD PARENT` (FD: its end of a socket pair with the pool; PARENT: the pid it
must die with, 0 inside a PID namespace, `stratarl.reward.worker_isolation`). Messages are
`call_frames` frames (pickles). It receives its setup (the trainer's sys.path, the agent file and
function, where to write its stacks), loads the agent function (a failure is reported as
"setup_failed" with the `AgentProgramError` message, naming the key), says "ready", and then runs
every ("episode", number, base_url, api_key, row, timeout_s) it is sent as a task of its own event
loop, concurrently, each answered with one ("result", number, status, message, pickled value):

- "done": the agent returned (its value, pickled apart, so a value the trainer cannot unpickle
  fails that one episode);
- "timeout": still running at `timeout_s`; the task is cancelled and not awaited (an agent that
  swallows the cancellation cannot hold its answer back);
- "error": it raised — SystemExit and KeyboardInterrupt too, caught inside the episode's own
  coroutine so that they never reach the loop — or returned something that cannot be pickled.

What this loop cannot answer for (an agent that blocks the loop, calls `os._exit`, crashes) the
pool sees from outside, by its deadline and the socket's end. On SIGUSR1 it writes every thread's
stack to the file its setup names (faulthandler), so the pool can say where a blocked loop was.
Its stdout and stderr are the trainer's (what an agent prints reaches the trainer's terminal).
"""

from __future__ import annotations

import asyncio
import faulthandler
import os
import pickle
import signal
import socket
import sys
import traceback
from typing import Any

from stratarl.agent.gateway.agent_program import AgentFunction, AgentProgramError, load_agent_function
from stratarl.reward.call_frames import HEADER, MAX_FRAME_BYTES, recv_frame, send_frame
from stratarl.reward.call_worker import describe
from stratarl.reward.worker_isolation import set_parent_death_signal

WORKER_COMMAND = "import sys; from stratarl.agent.gateway.agent_worker import main; main(sys.argv)"


def main(argv: list[str]) -> None:
    set_parent_death_signal(int(argv[2]) if len(argv) > 2 else 0)
    sock = socket.socket(fileno=int(argv[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    setup = pickle.loads(recv_frame(sock))
    sys.path[:0] = [p for p in setup["sys_path"] if p not in sys.path]
    stacks = open(setup["stack_path"], "w", encoding="utf-8")  # noqa: SIM115 (open for the process's life)
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True, chain=False)
    try:
        agent = load_agent_function(setup["agent_path"], setup["agent_name"])
    except BaseException as err:
        failure = str(err) if isinstance(err, AgentProgramError) else _one_line(err)
        send_frame(sock, pickle.dumps(("setup_failed", failure)))
        return
    send_frame(sock, pickle.dumps(("ready", os.getpid())))
    sock.setblocking(False)
    asyncio.run(serve(sock, agent))


async def serve(sock: socket.socket, agent: AgentFunction) -> None:
    """Start each episode the pool sends; return when the pool closes the socket."""
    reader, writer = await asyncio.open_connection(sock=sock)
    running: set[asyncio.Task] = set()  # held so that the loop does not drop them
    while True:
        try:
            (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
            if size > MAX_FRAME_BYTES:
                return
            kind, number, base_url, api_key, row, timeout_s = pickle.loads(await reader.readexactly(size))
        except (asyncio.IncompleteReadError, ConnectionError):
            return  # the pool closed: the episodes left die with the process
        assert kind == "episode", kind
        task = asyncio.create_task(episode(agent, number, base_url, api_key, row, timeout_s, writer))
        running.add(task)
        task.add_done_callback(running.discard)


async def episode(
    agent: AgentFunction,
    number: int,
    base_url: str,
    api_key: str,
    row: dict[str, Any],
    timeout_s: float,
    writer: asyncio.StreamWriter,
) -> None:
    """One episode to its end or its deadline, answered with one result message."""
    task = asyncio.ensure_future(_guarded(agent, base_url, api_key, row))
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    value = pickle.dumps(None)
    if not done:
        task.cancel()
        status, message = "timeout", f"cancelled after {timeout_s:g} s"
    else:
        returned, outcome = task.result()
        status, message = ("done", "") if returned else ("error", _describe(outcome))
        if returned:
            try:
                value = pickle.dumps(outcome)
            except Exception as err:
                status, message = "error", f"the agent's return value cannot be sent back: {describe(err)}"
    frame = pickle.dumps(("result", number, status, message[:300], value))
    writer.write(HEADER.pack(len(frame)) + frame)  # one write: frames of concurrent episodes never mix
    await writer.drain()


async def _guarded(agent: AgentFunction, base_url: str, api_key: str, row: dict) -> tuple[bool, Any]:
    """(True, what the agent returned) or (False, what it raised). SystemExit and KeyboardInterrupt
    are caught here, inside the episode: raised out of a task, asyncio would re-raise them out of
    the loop and end every episode of the worker."""
    try:
        return True, await agent(base_url, api_key, row)
    except asyncio.CancelledError:
        raise
    except BaseException as err:
        return False, err


def _describe(err: BaseException) -> str:
    """ "RuntimeError: boom", "SystemExit: exit code 3"."""
    text = describe(err)
    return text if text.startswith(type(err).__name__) else f"{type(err).__name__}: {text}"


def _one_line(err: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(err), err)).strip()


if __name__ == "__main__":
    main(sys.argv)
