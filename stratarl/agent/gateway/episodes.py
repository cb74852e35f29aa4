"""Layer 5, agent gateway: run the agent program on N rows at once, each episode under a deadline.

`run_episodes` opens one episode per row on a serving `Gateway`, runs at most `max_concurrent`
agent coroutines at a time in this event loop, and returns the finished captures in row order. An
episode that outlives `timeout_s` is cancelled (its coroutine gets CancelledError, later calls of
it get 404) and marked "timeout"; one that raises, or returns something that is not a reward, is
marked "error" with the message. Neither stops the others; the caller counts them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from stratarl.agent.gateway.agent_program import AgentFunction, read_reward
from stratarl.agent.gateway.capture import EpisodeCapture
from stratarl.agent.gateway.server import Gateway


async def run_episodes(
    gateway: Gateway,
    agent: AgentFunction,
    rows: Sequence[dict[str, Any]],
    *,
    timeout_s: float,
    max_concurrent: int,
) -> list[EpisodeCapture]:
    slots = asyncio.Semaphore(max_concurrent)

    async def one(row: dict[str, Any]) -> EpisodeCapture:
        async with slots:
            base_url, capture = gateway.open_episode(row)
            await run_one(agent, gateway.api_key, base_url, capture, timeout_s=timeout_s)
            return capture

    return list(await asyncio.gather(*(one(row) for row in rows)))


async def run_one(
    agent: AgentFunction, api_key: str, base_url: str, capture: EpisodeCapture, *, timeout_s: float
) -> None:
    """One episode to its end; the capture's status, reward and error say how it ended."""
    try:
        value = await asyncio.wait_for(agent(base_url, api_key, dict(capture.row)), timeout_s)
        capture.reward, capture.reward_extras = read_reward(value)
        capture.status = "done"
    except TimeoutError:
        capture.status, capture.error = "timeout", f"cancelled after {timeout_s:g} s"
    except Exception as err:  # the agent's own failure: counted, the others go on
        capture.status, capture.error = "error", f"{type(err).__name__}: {err}"[:300]
