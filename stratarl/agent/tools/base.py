"""Layer 5, agent loops: the tool interface (verl's BaseTool shape), its schema and result truncation.

A tool has an OpenAI function schema (`{"type": "function", "function": {"name", "description",
"parameters"}}`) and three async steps per call, as in verl: `create` an instance (per-sample
state from `tools_kwargs[name]["create_kwargs"]`), `execute` it with the parsed arguments, and
`release` it. `execute` returns a `ToolResult`; raising is fine — the loop turns the exception into
an error observation and records it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

TRUNCATION_SIDES = ("head", "tail", "middle")
# verl names the side by what is cut; we name it by what is kept.
VERL_TRUNCATION_SIDES = {"left": "head", "right": "tail", "middle": "middle"}


@dataclass(frozen=True)
class ToolResult:
    """text: what the model sees; reward: an optional step reward (verl's tool_rewards); metrics."""

    text: str
    reward: float | None = None
    metrics: dict[str, Any] = field(default_factory=dict)


def check_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema itself, after checking it is an OpenAI function schema with a name."""
    function = schema.get("function") if isinstance(schema, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        raise ValueError(
            f"a tool schema needs {{'type': 'function', 'function': {{'name': ...}}}}, got {schema!r}"
        )
    if schema.get("type", "function") != "function":
        raise ValueError(f"only function tools are supported, got type {schema.get('type')!r}")
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict):
        raise ValueError(f"tool {function['name']!r}: parameters must be a JSON schema object")
    return schema


class Tool:
    """Base class: subclasses implement `execute`; `create`/`release` keep per-instance state."""

    def __init__(self, config: dict[str, Any] | None, schema: dict[str, Any]) -> None:
        self.config = dict(config or {})
        self.schema = check_schema(schema)
        self.instances: dict[str, dict[str, Any]] = {}

    @property
    def name(self) -> str:
        return self.schema["function"]["name"]

    def required_arguments(self) -> list[str]:
        return list(self.schema["function"].get("parameters", {}).get("required", []))

    async def create(self, instance_id: str | None = None, **create_kwargs: Any) -> str:
        instance_id = instance_id or uuid.uuid4().hex
        self.instances[instance_id] = dict(create_kwargs)
        return instance_id

    async def execute(self, instance_id: str, arguments: dict[str, Any], **context: Any) -> ToolResult:
        raise NotImplementedError

    async def release(self, instance_id: str) -> None:
        self.instances.pop(instance_id, None)

    def check_arguments(self, arguments: dict[str, Any]) -> None:
        """Raise ValueError naming the missing required arguments."""
        missing = [key for key in self.required_arguments() if key not in arguments]
        if missing:
            raise ValueError(f"{self.name}: missing required argument(s) {', '.join(missing)}")


def truncate_text(text: str, max_chars: int, side: str = "middle") -> str:
    """Keep at most `max_chars` characters of `text`: its head, its tail, or both halves of the middle
    cut, with a marker where text was removed (the marker is not counted)."""
    if side not in TRUNCATION_SIDES:
        raise ValueError(f"truncation side must be one of {TRUNCATION_SIDES}, got {side!r}")
    if max_chars < 0:
        raise ValueError(f"max_chars must be >= 0, got {max_chars}")
    if len(text) <= max_chars:
        return text
    if side == "head":
        return text[:max_chars] + "...(truncated)"
    if side == "tail":
        return "(truncated)..." + text[len(text) - max_chars :]
    head = max_chars - max_chars // 2
    tail = max_chars // 2
    return text[:head] + "...(truncated)..." + (text[len(text) - tail :] if tail else "")
