"""Layer 5, agent loops: one episode as an explicit state machine (verl's ToolAgentLoop, our form).

    GENERATING ──(turn sampled)──► budget / turn limits? ──► TERMINATED
         ▲                          │ tool calls            │ no call, interaction  │ no call
         │                          ▼                       ▼                       ▼
         └──── observation ◄── PROCESSING_TOOLS       INTERACTING ──(done)──► TERMINATED
                 appended                                                        ("eos")

A session never calls the engine itself: `request()` says what to generate next and
`on_generated()` takes the result, so a driver (`runner`) can batch the turns of many sessions
into one engine call. Tools and interactions are async (`process_tools`, `interact`) and are user
code, run under deadlines (`agent.isolation`): a call that times out, exits or crashes becomes an
error observation (tools) or ends the episode with "interaction_error", and is recorded in
`Trajectory.failures`. The response
never exceeds `response_budget` tokens: each turn's max_tokens is capped by the room left, and an
observation that would not leave room for one more action token is not appended (the episode
stops with "response_budget"), as in verl.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import time
from dataclasses import dataclass
from typing import Any

from stratarl.agent.interactions.base import Interaction
from stratarl.agent.isolation import CallFailure, InteractionRunner, ThreadToolRunner, ToolError
from stratarl.agent.rendering import ChatRenderer
from stratarl.agent.tool_parsers import ToolCall, get_parser
from stratarl.agent.tools.base import Tool, truncate_text
from stratarl.agent.trajectory import ToolCallRecord, Trajectory, Turn
from stratarl.rollout.interface import GenerationRequest, GenerationResult, SamplingParams


class State(enum.Enum):
    GENERATING = "generating"
    PROCESSING_TOOLS = "processing_tools"
    INTERACTING = "interacting"
    TERMINATED = "terminated"


@dataclass(frozen=True)
class LoopLimits:
    """response_budget: most response tokens (assistant + observation), verl's response_length;
    max_assistant_turns / max_user_turns: None = unlimited (user turns count tool observations and
    interaction replies, as verl); max_parallel_calls: calls run per turn (extra ones are dropped);
    tool_timeout_s: per call; interaction_timeout_s: per call of an interaction (start, respond,
    finalize); max_tool_response_chars / truncate_side ("head", "tail", "middle");
    on_parse_error: "terminate" or "feedback" (the error goes back to the model as a tool message);
    tool_format: a parser of `tool_parsers.PARSERS`."""

    response_budget: int = 256
    max_assistant_turns: int | None = None
    max_user_turns: int | None = None
    max_parallel_calls: int = 1
    tool_timeout_s: float = 10.0
    interaction_timeout_s: float = 30.0
    max_tool_response_chars: int = 256
    truncate_side: str = "middle"
    on_parse_error: str = "terminate"
    tool_format: str = "hermes"

    def __post_init__(self) -> None:
        if self.on_parse_error not in ("terminate", "feedback"):
            raise ValueError(f"on_parse_error must be 'terminate' or 'feedback', got {self.on_parse_error!r}")
        if self.tool_timeout_s <= 0 or self.interaction_timeout_s <= 0:
            raise ValueError("tool_timeout_s and interaction_timeout_s must be > 0")
        if self.response_budget < 1 or self.max_parallel_calls < 1:
            raise ValueError("response_budget and max_parallel_calls must be >= 1")
        get_parser(self.tool_format)


class ToolAgentSession:
    """One episode: prompt ids in, a `Trajectory` out."""

    def __init__(
        self,
        trajectory: Trajectory,
        *,
        renderer: ChatRenderer,
        limits: LoopLimits,
        tools: dict[str, Tool] | None = None,
        tools_kwargs: dict[str, Any] | None = None,
        interaction: Interaction | None = None,
        interaction_kwargs: dict[str, Any] | None = None,
        tool_runner: Any = None,
        interaction_runner: InteractionRunner | None = None,
    ) -> None:
        self.trajectory, self.renderer, self.limits = trajectory, renderer, limits
        # Where user code runs (agent.isolation): tools in threads unless a runner is given.
        self.tool_runner = tool_runner or ThreadToolRunner(timeout_s=limits.tool_timeout_s)
        self.interaction_runner = interaction_runner or InteractionRunner(
            timeout_s=limits.interaction_timeout_s
        )
        self.tools = tools or {}
        self.tools_kwargs = tools_kwargs or {}
        self.interaction, self.interaction_kwargs = interaction, interaction_kwargs or {}
        self.parse = get_parser(limits.tool_format)
        self.state = State.GENERATING
        self.pending_calls: list[ToolCall] = []
        self.pending_errors: list[str] = []
        self.interaction_id: str | None = None

    @property
    def room(self) -> int:
        return self.limits.response_budget - len(self.trajectory.response_ids)

    def stop(self, reason: str) -> None:
        self.trajectory.stop_reason, self.state = reason, State.TERMINATED

    async def start(self) -> None:
        if self.interaction is not None:
            interaction = self.interaction
            self.interaction_id = await self._interaction_call(
                "start", lambda: interaction.start(None, **self.interaction_kwargs)
            )

    async def finish(self) -> None:
        failed = self.trajectory.stop_reason == "interaction_error"  # do not wait on it twice
        if self.interaction is not None and self.interaction_id is not None and not failed:
            interaction, instance_id = self.interaction, self.interaction_id
            await self._interaction_call("finalize", lambda: interaction.finalize(instance_id))

    async def _interaction_call(self, step: str, make: Any) -> Any:
        """One call of the interaction under its deadline; a failure ends the episode
        ("interaction_error"), is recorded, and returns None."""
        try:
            return await self.interaction_runner.run(make)
        except CallFailure as failure:
            reason, message = failure.reason, failure.message
        except Exception as err:
            reason, message = "error", f"{type(err).__name__}: {err}"
        self.trajectory.failures.append(f"interaction_{reason}")
        self.trajectory.failure_messages.append(f"interaction {step}: {message}"[:300])
        self.stop("interaction_error")
        return None

    # --- GENERATING ----------------------------------------------------------------------
    def request(self, sampling: SamplingParams, seed: int | None = None) -> GenerationRequest:
        """The next turn to sample: the whole stream so far as prompt, max_tokens capped by the room left."""
        t = self.trajectory
        params = dataclasses.replace(sampling, max_tokens=min(sampling.max_tokens, self.room), seed=seed)
        return GenerationRequest(
            f"{t.request_id}/{t.num_assistant_turns}", t.prompt_ids + t.response_ids, params
        )

    def append_turn(self, result: GenerationResult) -> Turn:
        """Append the sampled ids with mask 1 and their log-probs; record the turn and its message."""
        t = self.trajectory
        ids = list(result.response_ids)
        versions = list(result.token_versions)
        start, end = t.append(ids, sampled=True, log_probs=list(result.log_probs), versions=versions)
        text = self.renderer.assistant_text(ids)
        turn = Turn(
            "assistant", start, end, text, result.finish_reason, result.weight_version, result.replica_id
        )
        t.turns.append(turn)
        t.messages.append({"role": "assistant", "content": text})
        t.num_assistant_turns += 1
        return turn

    def on_generated(self, result: GenerationResult) -> None:
        """Take a sampled turn and decide the next state (checks in verl's order)."""
        t = self.trajectory
        turn = self.append_turn(result)
        if self.room <= 0:
            return self.stop("response_budget")
        if result.finish_reason != "stop":
            return self.stop("max_tokens")
        if self.limits.max_assistant_turns and t.num_assistant_turns >= self.limits.max_assistant_turns:
            return self.stop("max_assistant_turns")
        if self.limits.max_user_turns and t.num_user_turns >= self.limits.max_user_turns:
            return self.stop("max_user_turns")
        text = turn.text
        parsed = self.parse(text)
        turn.parse_errors = list(parsed.errors)
        if parsed.is_failure and self.limits.on_parse_error == "terminate":
            return self.stop("parse_error")
        self.pending_calls, self.pending_errors = parsed.calls, list(parsed.errors)
        if parsed.calls or parsed.errors:
            self.state = State.PROCESSING_TOOLS
        elif self.interaction is not None:
            self.state = State.INTERACTING
        else:
            self.stop("eos")

    # --- PROCESSING_TOOLS ----------------------------------------------------------------
    async def process_tools(self) -> None:
        """Run this turn's calls concurrently, then append their results as one observation."""
        calls = self.pending_calls[: self.limits.max_parallel_calls]
        records = await asyncio.gather(*(self.call_tool(call) for call in calls))
        self.trajectory.turns[-1].tool_calls = list(records)
        messages = [{"role": "tool", "content": r.result} for r in records]
        messages += [
            {"role": "tool", "content": f"Error: could not parse tool call: {e}"} for e in self.pending_errors
        ]
        self.pending_calls, self.pending_errors = [], []
        self.append_observation(messages, role="tool")

    async def call_tool(self, call: ToolCall) -> ToolCallRecord:
        """create → execute → release with a time limit; an error becomes the observation text."""
        record = ToolCallRecord(call.name, dict(call.arguments))
        started = time.perf_counter()
        tool = self.tools.get(call.name)
        try:
            if tool is None:
                raise LookupError(
                    f"unknown tool {call.name!r}; available: {', '.join(sorted(self.tools)) or 'none'}"
                )
            create_kwargs = self.tools_kwargs.get(call.name, {}).get("create_kwargs", {})
            context = {"trajectory": self.trajectory}
            result = await self.tool_runner.run(tool, create_kwargs, dict(call.arguments), context)
            record.result, record.reward = str(result.text), result.reward
        except CallFailure as failure:  # timed out, exited, crashed: also a failure of the episode
            record.error, record.failure = failure.message, failure.reason
            self.trajectory.failures.append(f"tool_{failure.reason}")
            self.trajectory.failure_messages.append(
                f"tool {call.name}: {failure.reason}: {failure.message}"[:300]
            )
        except ToolError as err:  # raised in a worker process: already "<Class>: <message>"
            record.error = str(err)
        except Exception as err:
            record.error = f"{type(err).__name__}: {err}"
        record.duration_s = time.perf_counter() - started
        if record.error is not None:
            record.result = f"Error when executing tool: {record.error}"
        record.result = truncate_text(
            record.result, self.limits.max_tool_response_chars, self.limits.truncate_side
        )
        return record

    # --- INTERACTING -----------------------------------------------------------------------
    async def interact(self) -> None:
        """Ask the interaction for a reply; append it as a user turn unless the episode ends."""
        assert self.interaction is not None and self.interaction_id is not None
        interaction, instance_id, messages = self.interaction, self.interaction_id, self.trajectory.messages
        reply = await self._interaction_call("respond", lambda: interaction.respond(instance_id, messages))
        if reply is None:  # the interaction failed: the episode has stopped
            return
        if reply.should_terminate:
            # The closing reply is recorded (with its score) but not appended: an empty span.
            end = len(self.trajectory.response_ids)
            self.trajectory.turns.append(Turn("user", end, end, reply.text, score=reply.score))
            return self.stop("interaction_done")
        self.append_observation([{"role": "user", "content": reply.text}], role="user", score=reply.score)

    def append_observation(
        self, messages: list[dict[str, Any]], *, role: str, score: float | None = None
    ) -> None:
        """Render once, append with mask 0, or stop if it would leave no room for an action token."""
        t = self.trajectory
        ids = self.renderer.observation_ids(messages)
        if len(ids) >= self.room:
            return self.stop("response_budget")
        start, end = t.append(ids, sampled=False)
        t.turns.append(Turn(role, start, end, self.renderer.tokenizer.decode(ids), score=score))
        t.messages.extend(messages)
        t.num_user_turns += 1
        self.state = State.GENERATING


class SingleTurnSession(ToolAgentSession):
    """verl's single_turn_agent: one generation, whatever it contains; no tools, no interaction."""

    def on_generated(self, result: GenerationResult) -> None:
        self.append_turn(result)
        if self.room <= 0:
            return self.stop("response_budget")
        self.stop("eos" if result.finish_reason == "stop" else "max_tokens")
