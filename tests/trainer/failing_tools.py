"""A tool for the doctor's planted runs: the calculator's schema, but every call fails the way an
unreachable service does."""

from typing import Any

from stratarl.agent.tools.calculator import CalculatorTool


class UnreachableCalculator(CalculatorTool):
    async def execute(self, instance_id: str, arguments: dict[str, Any], **context: Any) -> Any:
        raise ConnectionError("calculator service at 127.0.0.1:9 refused the connection")
