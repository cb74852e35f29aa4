"""Layer 5, agent loops: the interaction interface and its YAML registry (verl's format).

An interaction speaks after an assistant turn that made no tool call: it reads the conversation
and returns a reply (appended as a user turn, masked out of the loss), whether the episode ends,
and an optional turn score. Per sample, `extra_info["interaction_kwargs"]` names the interaction
(`name`) and carries its per-sample data (e.g. `ground_truth`). Registry YAML:

    interaction:
      - name: answer_check
        class_name: stratarl.agent.interactions.answer_check.AnswerCheckInteraction
        config: {max_attempts: 2}
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stratarl.agent.class_list import build_class_list, read_class_list_file


@dataclass(frozen=True)
class InteractionReply:
    """text: the user's reply; should_terminate: end the episode; score: this turn's score or None."""

    text: str
    should_terminate: bool
    score: float | None = None
    metrics: dict[str, Any] = field(default_factory=dict)


class Interaction:
    """Base class: subclasses implement `respond`; `start`/`finalize` keep per-episode state."""

    def __init__(self, config: dict[str, Any] | None = None, name: str | None = None) -> None:
        self.config = dict(config or {})
        self.name = name or type(self).__name__.removesuffix("Interaction").lower()
        self.instances: dict[str, dict[str, Any]] = {}

    async def start(self, instance_id: str | None = None, **kwargs: Any) -> str:
        instance_id = instance_id or uuid.uuid4().hex
        self.instances[instance_id] = dict(kwargs)
        return instance_id

    async def respond(self, instance_id: str, messages: list[dict[str, Any]]) -> InteractionReply:
        raise NotImplementedError

    async def finalize(self, instance_id: str) -> None:
        self.instances.pop(instance_id, None)


def interactions_from_config(config: dict[str, Any]) -> dict[str, Interaction]:
    """{name: interaction} from a parsed config with an `interaction` list."""
    return build_class_list(config, "interaction", Interaction, _build_interaction)


def _build_interaction(cls: type, entry: dict[str, Any], where: str) -> Interaction:
    return cls(entry.get("config") or {}, name=entry.get("name"))


def load_interactions(path: str | Path) -> dict[str, Interaction]:
    return interactions_from_config(read_class_list_file(path))
