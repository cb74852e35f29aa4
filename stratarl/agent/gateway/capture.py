"""Layer 5, agent gateway: what one episode's model calls were, token for token.

Every completion the gateway returns to an episode is recorded as a `CallRecord`: the prompt ids
the engine saw (as the engine echoes them), the sampled ids, their log-probs and weight versions,
why it stopped, and the text the agent received. Training rows are built from these records
(`episode_rows`), never from the chat text, so what the model sampled is what is trained.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stratarl.rollout.interface import GenerationResult


@dataclass(frozen=True)
class CallRecord:
    """One sampled completion (a request with `n` > 1 records n of them, one per choice)."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    log_probs: tuple[float, ...]
    token_versions: tuple[int, ...]
    weight_version: int
    finish_reason: str  # the engine's "stop" / "length"
    replica_id: int
    text: str  # what the agent was given (stop string cut, tool calls as the API returned them)

    @classmethod
    def from_result(cls, result: GenerationResult, text: str) -> CallRecord:
        return cls(
            result.prompt_ids,
            result.response_ids,
            result.log_probs,
            result.token_versions,
            result.weight_version,
            result.finish_reason,
            result.replica_id,
            text,
        )

    @property
    def sequence(self) -> tuple[int, ...]:
        return self.prompt_ids + self.response_ids


@dataclass
class EpisodeCapture:
    """One episode: the dataset row it runs, its calls in order, and how it ended.

    status: "running", then "done" (the agent returned a reward or None), "timeout" (cancelled at
    agent.gateway.episode_timeout_s, or its worker's loop was blocked past it), "error" (the agent
    raised, or returned something else) or "crash" (its agent worker process ended while it ran).
    """

    episode_id: str
    row: dict[str, Any]
    calls: list[CallRecord] = field(default_factory=list)
    last_messages: list[dict[str, Any]] = field(default_factory=list)  # the last chat call's, for the trace
    status: str = "running"
    reward: float | None = None
    reward_extras: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    num_tool_calls: int = 0  # tool calls the API returned to the agent
    prompts_kept_sampled_ids: int = 0  # chat prompts that kept an earlier call's sampled ids

    @property
    def is_open(self) -> bool:
        return self.status == "running"

    @property
    def final_text(self) -> str:
        """The last assistant message the agent received: what a configured reward scores."""
        return self.calls[-1].text if self.calls else ""
