"""Layer 5, agent gateway: run the agent program on N rows at once, each episode under a deadline.

`run_episodes` opens one episode per row on a serving `Gateway`, runs at most `max_concurrent` at a
time through an episode runner — `agent_pool.AgentPool` (the agent in contained worker processes,
the trainer's default) or `InProcessAgent` (the agent as coroutines of this event loop,
`agent.gateway.in_process`) — and returns the finished captures in row order. Each episode ends as
one `EpisodeOutcome`, which `Gateway.end_episode` writes into its capture: "done" with the
reward the agent returned, "timeout" (cancelled at `timeout_s`), "error" (it raised, or returned
something that is not a reward) or "crash" (its worker process ended). None of them stops the
others; the caller counts them. An episode that ended takes no more calls (404), and its requests
still waiting for the engine are dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from stratarl.agent.gateway.agent_program import AgentFunction
from stratarl.agent.gateway.capture import EpisodeCapture
from stratarl.agent.gateway.server import Gateway


@dataclass(frozen=True)
class EpisodeOutcome:
    """How one run of the agent ended: status "done" (and the `value` it returned), "timeout",
    "error" or "crash" (and the `error` message)."""

    status: str
    value: Any = None
    error: str | None = None


class EpisodeRunner(Protocol):
    async def run(self, base_url: str, api_key: str, row: dict[str, Any]) -> EpisodeOutcome: ...


class InProcessAgent:
    """The agent function as a coroutine of the caller's event loop, cancelled at `timeout_s`.
    Contains what the agent raises (not SystemExit); a blocking agent stalls every episode, and
    `os._exit` ends the trainer."""

    def __init__(self, agent: AgentFunction, *, timeout_s: float) -> None:
        self.agent, self.timeout_s = agent, timeout_s

    async def run(self, base_url: str, api_key: str, row: dict[str, Any]) -> EpisodeOutcome:
        try:
            value = await asyncio.wait_for(self.agent(base_url, api_key, row), self.timeout_s)
        except TimeoutError:
            return EpisodeOutcome("timeout", error=f"cancelled after {self.timeout_s:g} s")
        except Exception as err:  # the agent's own failure: counted, the others go on
            return EpisodeOutcome("error", error=f"{type(err).__name__}: {err}"[:300])
        return EpisodeOutcome("done", value=value)


async def run_episodes(
    gateway: Gateway,
    runner: EpisodeRunner,
    rows: Sequence[dict[str, Any]],
    *,
    max_concurrent: int,
) -> list[EpisodeCapture]:
    slots = asyncio.Semaphore(max_concurrent)

    async def one(row: dict[str, Any]) -> EpisodeCapture:
        async with slots:
            base_url, capture = gateway.open_episode(row)
            outcome = await runner.run(base_url, gateway.api_key, dict(capture.row))
            gateway.end_episode(capture, outcome.status, value=outcome.value, error=outcome.error)
            return capture

    return list(await asyncio.gather(*(one(row) for row in rows)))
