"""Layer 5, agent gateway: OpenAI function calling, mapped to and from the model's own tool-call text.

Into the model: `tools` go to the chat template as its `tools` argument (HF's convention); an earlier
assistant message's `tool_calls` are written back into its content in the format the model samples
(`agent.tool_format`: hermes `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, or
llama3_json objects joined by "; "), so any template renders them, even one that knows no tools.
Out of the model: the sampled text is parsed with `stratarl.agent.tool_parsers`; calls become
`message.tool_calls` (arguments as a JSON string, ids `call_<n>`) and the finish reason
`tool_calls`; a malformed call stays in `content` as text (the agent sees what the model wrote).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from stratarl.agent.tool_parsers import ParseResult, ToolCall, get_parser


def _hermes(call: ToolCall) -> str:
    return "<tool_call>" + json.dumps({"name": call.name, "arguments": call.arguments}) + "</tool_call>"


def _llama3_json(call: ToolCall) -> str:
    return json.dumps({"name": call.name, "parameters": call.arguments})


# format name -> (how one call is written, what joins several)
CALL_WRITERS: dict[str, tuple[Callable[[ToolCall], str], str]] = {
    "hermes": (_hermes, "\n"),
    "llama3_json": (_llama3_json, "; "),
}


class ToolCallFormat:
    """One tool-call format (a name of `tool_parsers.PARSERS`), both ways."""

    def __init__(self, name: str) -> None:
        self.parse: Callable[[str], ParseResult] = get_parser(name)
        self.write_call, self.separator = CALL_WRITERS[name]

    def template_messages(self, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages as the chat template reads them: text content, earlier calls written in."""
        out = []
        for message in messages:
            message = dict(message)
            calls = message.pop("tool_calls", None)
            if calls:
                text = self.separator.join(
                    self.write_call(ToolCall(c["name"], c["arguments"])) for c in calls
                )
                message["content"] = f"{message['content']}\n{text}" if message["content"] else text
            out.append(message)
        return out

    def response_message(self, text: str, *, tools_offered: bool, call_offset: int = 0) -> tuple[dict, bool]:
        """(the OpenAI assistant message for sampled `text`, whether it calls tools). Calls are
        parsed only when tools were offered; ids count from `call_offset` within the episode."""
        parsed = self.parse(text) if tools_offered else ParseResult(text)
        if not parsed.calls or parsed.errors:
            return {"role": "assistant", "content": text, "tool_calls": None}, False
        calls = [
            {
                "id": f"call_{call_offset + i}",
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for i, c in enumerate(parsed.calls)
        ]
        return {"role": "assistant", "content": parsed.content.strip() or None, "tool_calls": calls}, True
