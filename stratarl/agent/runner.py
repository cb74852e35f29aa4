"""Layer 5, agent loops: run N episodes against one rollout engine, turns batched across episodes.

Each round: every session that wants a turn goes into ONE `engine.generate` call (the engine's
batching then works across episodes), then all tool calls and interaction replies of the round run
concurrently (asyncio), then finished episodes are handed to `on_finished` at once — e.g. to a
`StreamingScorer`, so an episode is scored while the others still generate (verl's reward loop).

An input row is a dict with the dataset's fields: `prompt_ids` (chat-templated, generation prompt
included), `messages` (the prompt's chat messages), and optionally `agent_name`
("tool_agent" / "single_turn_agent"), `data_source`, `ground_truth`, `extra_info` (with
`tools_kwargs`, `interaction_kwargs`), all carried into `Trajectory.sample`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from stratarl.agent.interactions.base import Interaction
from stratarl.agent.isolation import InteractionRunner, ThreadToolRunner
from stratarl.agent.rendering import ChatRenderer
from stratarl.agent.tool_loop import LoopLimits, SingleTurnSession, State, ToolAgentSession
from stratarl.agent.tools.base import Tool
from stratarl.agent.trajectory import Trajectory
from stratarl.rollout.interface import RolloutEngine, SamplingParams

AGENT_LOOPS: dict[str, type[ToolAgentSession]] = {
    "tool_agent": ToolAgentSession,
    "single_turn_agent": SingleTurnSession,
}


@dataclass
class AgentLoopRunner:
    """What every episode of a run shares: engine, renderer, limits, tools, interactions."""

    engine: RolloutEngine
    renderer: ChatRenderer
    limits: LoopLimits = field(default_factory=LoopLimits)
    tools: dict[str, Tool] = field(default_factory=dict)
    interactions: dict[str, Interaction] = field(default_factory=dict)
    default_agent: str = "tool_agent"
    # Where tool calls run (agent.isolation): None = a thread per call, under limits.tool_timeout_s.
    tool_runner: Any = None
    interaction_runner: InteractionRunner | None = None

    def __post_init__(self) -> None:
        if self.tool_runner is None:
            self.tool_runner = ThreadToolRunner(timeout_s=self.limits.tool_timeout_s)
        if self.interaction_runner is None:
            self.interaction_runner = InteractionRunner(timeout_s=self.limits.interaction_timeout_s)

    def make_session(self, index: int, row: dict[str, Any]) -> ToolAgentSession:
        agent = row.get("agent_name") or self.default_agent
        if agent not in AGENT_LOOPS:
            raise ValueError(f"unknown agent_name {agent!r}; choose one of {', '.join(sorted(AGENT_LOOPS))}")
        extra = dict(row.get("extra_info") or {})
        interaction_kwargs = dict(extra.get("interaction_kwargs") or {})
        interaction = None
        if interaction_kwargs and agent == "tool_agent":
            name = interaction_kwargs.get("name")
            if name not in self.interactions:
                raise ValueError(f"interaction {name!r} is not registered: {sorted(self.interactions)}")
            interaction = self.interactions[name]
        trajectory = Trajectory(
            request_id=str(row.get("request_id", index)),
            prompt_ids=[int(t) for t in row["prompt_ids"]],
            messages=[dict(m) for m in row.get("messages") or []],
            sample={k: v for k, v in row.items() if k not in ("prompt_ids", "messages")},
        )
        return AGENT_LOOPS[agent](
            trajectory,
            renderer=self.renderer,
            limits=self.limits,
            tools=self.tools if agent == "tool_agent" else {},
            tools_kwargs=dict(extra.get("tools_kwargs") or {}),
            interaction=interaction,
            interaction_kwargs=interaction_kwargs,
            tool_runner=self.tool_runner,
            interaction_runner=self.interaction_runner,
        )

    async def run(
        self,
        rows: Sequence[dict[str, Any]],
        sampling: SamplingParams,
        *,
        seed: int | None = None,
        on_finished: Callable[[int, Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """All episodes to the end; trajectories in row order. With `seed`, turn k of row i samples
        with seed + k·N + i: reproducible, and distinct across rows and turns."""
        sessions = [self.make_session(i, row) for i, row in enumerate(rows)]
        await asyncio.gather(*(s.start() for s in sessions))
        reported = [False] * len(sessions)
        rounds = 0
        while not all(reported):
            waiting = [(i, s) for i, s in enumerate(sessions) if s.state is State.GENERATING]
            if waiting:
                requests = [
                    s.request(sampling, None if seed is None else seed + rounds * len(sessions) + i)
                    for i, s in waiting
                ]
                for (_, session), result in zip(waiting, self.engine.generate(requests), strict=True):
                    session.on_generated(result)
            await asyncio.gather(*(_advance(s) for s in sessions))
            for i, session in enumerate(sessions):
                if session.state is State.TERMINATED and not reported[i]:
                    reported[i] = True
                    await session.finish()
                    if on_finished is not None:
                        on_finished(i, session.trajectory)
            rounds += 1
        return [s.trajectory for s in sessions]

    def run_sync(
        self,
        rows: Sequence[dict[str, Any]],
        sampling: SamplingParams,
        *,
        seed: int | None = None,
        on_finished: Callable[[int, Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """`run` from synchronous code (starts its own event loop)."""
        return asyncio.run(self.run(rows, sampling, seed=seed, on_finished=on_finished))


async def _advance(session: ToolAgentSession) -> None:
    if session.state is State.PROCESSING_TOOLS:
        await session.process_tools()
    elif session.state is State.INTERACTING:
        await session.interact()
