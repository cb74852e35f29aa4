"""An agent program trained unchanged through the gateway (docs/agent_gateway.md): plain `openai`
client code with its own loop — ask, run the calculator when the model calls it, ask again.

Train it:  stratarl train RECIPE agent.gateway.enable=true \
               agent.gateway.agent_function_path=examples/openai_agent/calculator_agent.py
It returns None, so the run's configured reward scores the last assistant message.
"""

import ast
import json
import operator

from openai import AsyncOpenAI

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression such as 12*34",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def calculate(expression: str) -> str:
    """+ - * / on numbers, nothing else (no eval)."""

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        raise ValueError("not an arithmetic expression")

    try:
        return str(value(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError) as err:
        return f"error: {err}"


async def run_episode(base_url: str, api_key: str, row: dict) -> float | None:
    client = AsyncOpenAI(base_url=base_url, api_key=api_key)
    messages = list(row["messages"])
    for _ in range(3):
        reply = await client.chat.completions.create(
            model="policy", messages=messages, tools=[CALCULATOR], max_tokens=48
        )
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            arguments = json.loads(call.function.arguments)
            result = calculate(str(arguments.get("expression", "")))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return None
