"""Layer 5, agent loops: a calculator tool — exact integer/decimal arithmetic on an expression.

The expression is parsed with `ast` and only numbers, parentheses, unary ±, and + - * / // % ** are
evaluated (never `eval`): no names, calls or attributes. Integers stay exact (Python ints);
powers are bounded so `9**9**9` cannot hang the loop.
"""

from __future__ import annotations

import ast
import operator
from typing import Any

from stratarl.agent.tools.base import Tool, ToolResult

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_RESULT_DIGITS = 100

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}

SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / // % ** and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 4821*937"}},
            "required": ["expression"],
        },
    },
}


def evaluate_expression(expression: str) -> int | float:
    """The value of an arithmetic expression; ValueError for anything else."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise ValueError(f"not an arithmetic expression: {err.msg}") from None
    return _value(tree.body)


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent larger than {MAX_EXPONENT}")
        try:
            result = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ValueError("division by zero") from None
        if isinstance(result, int) and len(str(abs(result))) > MAX_RESULT_DIGITS:
            raise ValueError(f"result longer than {MAX_RESULT_DIGITS} digits")
        if isinstance(result, complex):
            raise ValueError("complex result")
        return result
    raise ValueError(f"unsupported element {type(node).__name__} in expression")


def format_number(value: int | float) -> str:
    """Integers as integers; floats that are whole as integers; other floats with up to 12 digits."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value) if isinstance(value, int) else f"{value:.12g}"


class CalculatorTool(Tool):
    """arguments: {"expression": str}; result: the value as text."""

    def __init__(self, config: dict[str, Any] | None = None, schema: dict[str, Any] | None = None) -> None:
        super().__init__(config, schema or SCHEMA)

    async def execute(self, instance_id: str, arguments: dict[str, Any], **context: Any) -> ToolResult:
        self.check_arguments(arguments)
        expression = arguments["expression"]
        if not isinstance(expression, str | int | float):
            raise ValueError("expression must be a string")
        return ToolResult(format_number(evaluate_expression(str(expression))))
