"""Layer 5, agent loops: what one episode produced, token by token and turn by turn (docs/design.md).

`Trajectory` holds the token stream (prompt ids; response ids = assistant and observation tokens in
order; `response_mask` 1 exactly on sampled ids; rollout log-probs, 0.0 on observation tokens), the
message history, and a `Turn` per span with the tool calls it made (name, arguments, result,
duration, error), plus why the episode stopped. `record()` is the JSON form `stratarl trace` shows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

# Why an episode ended.
StopReason = Literal[
    "eos",  # the model finished a turn without a tool call (and no interaction is attached)
    "max_tokens",  # a turn hit its max_tokens without EOS (an unfinished turn is never continued)
    "response_budget",  # no room left in the response budget (or the next observation would overflow it)
    "max_assistant_turns",
    "max_user_turns",
    "parse_error",  # a malformed tool call, with on_parse_error="terminate"
    "interaction_done",  # the interaction ended the episode
    "interaction_error",  # the interaction raised, timed out or exited (see Trajectory.failures)
    "agent_returned",  # an agent program behind the gateway returned (agent.gateway, docs/agent_gateway.md)
]


@dataclass
class ToolCallRecord:
    """One executed (or attempted) tool call."""

    name: str
    arguments: dict[str, Any]
    result: str = ""
    duration_s: float = 0.0
    error: str | None = None
    reward: float | None = None
    failure: str | None = None  # "timeout", "SystemExit", "process_exit", ...: not an ordinary error

    @property
    def is_error(self) -> bool:
        return self.error is not None


@dataclass
class Turn:
    """A span [start, end) of the response: an assistant turn (sampled) or an observation.

    role: "assistant", "tool" (tool results or a parse-error message), "user" (an interaction), or
    "observation" (the gateway: what an agent program's next prompt added, of unknown origin).
    """

    role: str
    start: int
    end: int
    text: str
    finish_reason: str | None = None  # assistant turns: the engine's "stop" / "length"
    weight_version: int | None = None  # assistant turns: the oldest weights that sampled a token of it
    replica_id: int | None = None  # assistant turns: the rollout replica that sampled it
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    parse_errors: list[str] = field(default_factory=list)
    score: float | None = None  # user turns: the interaction's turn score


@dataclass
class Trajectory:
    """One finished (or running) episode; `sample` carries the dataset row's fields through."""

    request_id: str
    prompt_ids: list[int]
    messages: list[dict[str, Any]]
    sample: dict[str, Any] = field(default_factory=dict)
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_log_probs: list[float] = field(default_factory=list)
    response_versions: list[int] = field(default_factory=list)  # per token; -1 on observations
    turns: list[Turn] = field(default_factory=list)
    stop_reason: str | None = None
    num_assistant_turns: int = 0
    num_user_turns: int = 0
    reward: float | None = None  # set when scored (e.g. during rollout)
    reward_extras: dict[str, Any] = field(default_factory=dict)
    # user code that timed out, exited or crashed: "tool_timeout", "interaction_SystemExit", ...
    failures: list[str] = field(default_factory=list)
    failure_messages: list[str] = field(default_factory=list)

    def append(
        self,
        ids: list[int],
        *,
        sampled: bool,
        log_probs: list[float] | None = None,
        versions: list[int] | None = None,
    ) -> tuple[int, int]:
        """Append a span; sampled ids get mask 1, their log-probs and the weight version of each
        (None: 0), observations mask 0, 0.0 and version -1."""
        start = len(self.response_ids)
        self.response_ids.extend(int(t) for t in ids)
        self.response_mask.extend([1 if sampled else 0] * len(ids))
        if sampled:
            if log_probs is None or len(log_probs) != len(ids):
                raise ValueError("sampled ids need one log-prob each")
            if versions is not None and len(versions) != len(ids):
                raise ValueError("sampled ids need one weight version each")
            self.response_log_probs.extend(float(x) for x in log_probs)
            self.response_versions.extend(int(v) for v in versions or [0] * len(ids))
        else:
            self.response_log_probs.extend([0.0] * len(ids))
            self.response_versions.extend([-1] * len(ids))
        return start, len(self.response_ids)

    @property
    def tool_calls(self) -> list[ToolCallRecord]:
        return [call for turn in self.turns for call in turn.tool_calls]

    @property
    def num_parse_failures(self) -> int:
        return sum(1 for turn in self.turns if turn.parse_errors)

    @property
    def turn_scores(self) -> list[float]:
        return [t.score for t in self.turns if t.role == "user" and t.score is not None]

    @property
    def tool_rewards(self) -> list[float]:
        return [c.reward for c in self.tool_calls if c.reward is not None]

    @property
    def num_turns(self) -> int:
        """verl's count: user turns + assistant turns + 1 (the prompt)."""
        return self.num_user_turns + self.num_assistant_turns + 1

    @property
    def last_action_index(self) -> int | None:
        """Position (in the response) of the last sampled token: where the reward goes."""
        for i in range(len(self.response_mask) - 1, -1, -1):
            if self.response_mask[i]:
                return i
        return None

    def record(self) -> dict[str, Any]:
        """A JSON-ready description of the episode (the trace's questions 4–7, docs/design.md)."""
        return {
            "request_id": self.request_id,
            "stop_reason": self.stop_reason,
            "num_turns": self.num_turns,
            "num_assistant_turns": self.num_assistant_turns,
            "num_user_turns": self.num_user_turns,
            "response_tokens": len(self.response_ids),
            "action_tokens": sum(self.response_mask),
            "reward": self.reward,
            "reward_on_token": self.last_action_index,
            "turn_scores": self.turn_scores,
            "failures": list(self.failure_messages),
            "turns": [
                {
                    "role": t.role,
                    "span": [t.start, t.end],
                    "text": t.text,
                    "finish_reason": t.finish_reason,
                    "weight_version": t.weight_version,
                    "replica_id": t.replica_id,
                    "parse_errors": list(t.parse_errors),
                    "score": t.score,
                    "tool_calls": [
                        {
                            "name": c.name,
                            "arguments": c.arguments,
                            "result": c.result,
                            "duration_s": round(c.duration_s, 6),
                            "error": c.error,
                            "failure": c.failure,
                            "reward": c.reward,
                        }
                        for c in t.tool_calls
                    ],
                }
                for t in self.turns
            ],
        }
