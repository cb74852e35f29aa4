"""Layer 5, agent loops: a Python interpreter tool that runs the model's code in the sandbox.

The same sandbox as the code scorer (`stratarl.reward.sandbox`): a fresh directory per call, no
network, no processes, no files outside it, CPU/memory/output/wall limits. The observation is the
program's stdout, then its stderr under a `stderr:` line when there is any, then a status line when
the run did not finish normally.
"""

from __future__ import annotations

import asyncio
from typing import Any

from stratarl.agent.tools.base import Tool, ToolResult
from stratarl.reward.sandbox import SandboxLimits, run_python

SCHEMA = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run a Python program (standard library only) and return what it prints.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "the program"}},
            "required": ["code"],
        },
    },
}


class PythonInterpreterTool(Tool):
    """arguments: {"code": str}; config keys are `SandboxLimits` fields (wall_seconds, memory_mb, ...)."""

    def __init__(self, config: dict[str, Any] | None = None, schema: dict[str, Any] | None = None) -> None:
        super().__init__(config, schema or SCHEMA)
        fields = SandboxLimits.__dataclass_fields__
        self.limits = SandboxLimits(**{k: v for k, v in self.config.items() if k in fields})

    async def execute(self, instance_id: str, arguments: dict[str, Any], **context: Any) -> ToolResult:
        self.check_arguments(arguments)
        code = arguments["code"]
        if not isinstance(code, str):
            raise ValueError("code must be a string")
        result = await asyncio.to_thread(run_python, code, limits=self.limits)
        text = result.stdout
        if result.stderr:
            text += ("\n" if text and not text.endswith("\n") else "") + "stderr:\n" + result.stderr
        if not result.ok:
            text += f"\n[status: {result.status}]"
        return ToolResult(text, metrics={"status": result.status, "duration_s": result.duration_s})
