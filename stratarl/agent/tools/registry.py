"""Layer 5, agent loops: tools built from a YAML tool config, in verl's format.

    tools:
      - class_name: stratarl.agent.tools.calculator.CalculatorTool
        config: {type: native}
        tool_schema:
          type: function
          function: {name: calculator, description: ..., parameters: {...}}

`class_name` is a dotted path to a `Tool` subclass; `config` goes to its constructor. Only native
tools are built (verl's `type: mcp` needs an MCP client and is refused with a clear error).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stratarl.agent.class_list import build_class_list, read_class_list_file
from stratarl.agent.tools.base import Tool


def tools_from_config(config: dict[str, Any]) -> dict[str, Tool]:
    """{tool name: tool} from a parsed tool config; duplicate names are refused."""
    return build_class_list(config, "tools", Tool, _build_tool, required=("class_name", "tool_schema"))


def _build_tool(cls: type, entry: dict[str, Any], where: str) -> Tool:
    tool_config = dict(entry.get("config") or {})
    if tool_config.get("type", "native") != "native":
        raise ValueError(f"{where}: only type 'native' is supported, got {tool_config['type']!r}")
    return cls(tool_config, entry["tool_schema"])


def load_tools(path: str | Path) -> dict[str, Tool]:
    """Build the tools of a YAML tool-config file."""
    return tools_from_config(read_class_list_file(path))


def tool_schemas(tools: dict[str, Tool]) -> list[dict[str, Any]]:
    """The OpenAI function schemas, e.g. for `apply_chat_template(..., tools=...)`."""
    return [tool.schema for tool in tools.values()]
