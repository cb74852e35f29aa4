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

import importlib
from pathlib import Path
from typing import Any

import yaml

from stratarl.agent.tools.base import Tool


def import_class(dotted: str) -> type:
    """`pkg.module.Class` -> the class; errors name the path."""
    module_name, _, class_name = dotted.rpartition(".")
    if not module_name:
        raise ValueError(f"class_name must be a dotted path like pkg.module.Class, got {dotted!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ImportError(f"cannot import module {module_name!r} for {dotted!r}: {err}") from err
    if not hasattr(module, class_name):
        raise AttributeError(f"module {module_name!r} has no class {class_name!r}")
    return getattr(module, class_name)


def tools_from_config(config: dict[str, Any]) -> dict[str, Tool]:
    """{tool name: tool} from a parsed tool config; duplicate names are refused."""
    entries = config.get("tools") if isinstance(config, dict) else None
    if not isinstance(entries, list):
        raise ValueError("a tool config needs a top-level 'tools' list")
    tools: dict[str, Tool] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "class_name" not in entry or "tool_schema" not in entry:
            raise ValueError(f"tools[{i}] needs 'class_name' and 'tool_schema'")
        tool_config = dict(entry.get("config") or {})
        if tool_config.get("type", "native") != "native":
            raise ValueError(f"tools[{i}]: only type 'native' is supported, got {tool_config['type']!r}")
        cls = import_class(entry["class_name"])
        if not (isinstance(cls, type) and issubclass(cls, Tool)):
            raise TypeError(f"tools[{i}]: {entry['class_name']} is not a stratarl Tool subclass")
        tool = cls(tool_config, entry["tool_schema"])
        if tool.name in tools:
            raise ValueError(f"tools[{i}]: duplicate tool name {tool.name!r}")
        tools[tool.name] = tool
    return tools


def load_tools(path: str | Path) -> dict[str, Tool]:
    """Build the tools of a YAML tool-config file."""
    with open(path, encoding="utf-8") as f:
        return tools_from_config(yaml.safe_load(f) or {})


def tool_schemas(tools: dict[str, Tool]) -> list[dict[str, Any]]:
    """The OpenAI function schemas, e.g. for `apply_chat_template(..., tools=...)`."""
    return [tool.schema for tool in tools.values()]
