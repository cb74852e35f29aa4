"""Layer 5, data: a task that needs a tool — multiplying multi-digit numbers with a calculator.

A problem is `a*b` with operands of `digits` digits (3–4 by default): a tiny model cannot multiply
these in its head, but it can call the calculator (`stratarl.agent.tools.calculator`) in hermes
format and copy the result. The response is correct when it ends with `Answer: <a·b>`
(`stratarl.reward.tool_arithmetic`). Each row's prompt is a system message describing the tool
(optional) and a user question; rows carry `agent_name: tool_agent` (verl's per-row agent choice).

SFT demonstrations: `extra_info["answer_messages"]` is the reference continuation as chat messages
— on a `tool_fraction` of the training rows it calls the calculator, reads the result and answers
(assistant, tool, assistant), on the others it answers at once. `extra_info["answer"]` is the same
continuation as ChatML text (the tiny models' template; the trainer appends the final EOS), and
`stratarl.agent.sft_target.sft_target_ids` renders `answer_messages` with any template into token
ids with a loss mask that is 0 on the tool result. Test rows always demonstrate the tool.
`write_tool_config` writes the calculator's `tools.yaml` (verl's format) next to the parquet files.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from stratarl.data.schema import write_rows
from stratarl.reward.arithmetic import format_answer
from stratarl.reward.tool_arithmetic import DATA_SOURCE

TOOL_NAME = "calculator"
TOOL_CONFIG: dict[str, Any] = {
    "tools": [
        {
            "class_name": "stratarl.agent.tools.calculator.CalculatorTool",
            "config": {"type": "native"},
            "tool_schema": {
                "type": "function",
                "function": {
                    "name": TOOL_NAME,
                    "description": "Evaluate an arithmetic expression exactly.",
                    "parameters": {
                        "type": "object",
                        "properties": {"expression": {"type": "string", "description": "e.g. 482*937"}},
                        "required": ["expression"],
                    },
                },
            },
        }
    ]
}
SYSTEM_PROMPT = (
    'Tool: calculator. Call it as <tool_call>{"name": "calculator", "arguments": {"expression": "..."}}'
    "</tool_call> and wait for the result. End with 'Answer: <integer>'."
)


def tool_call_text(expression: str) -> str:
    """The hermes call the demonstrations make (JSON with a space after ':' and ',', as json.dumps)."""
    call = {"name": TOOL_NAME, "arguments": {"expression": expression}}
    return f"<tool_call>{json.dumps(call)}</tool_call>"


def demonstration(expression: str, value: int, *, uses_tool: bool) -> list[dict[str, str]]:
    """The reference continuation after the prompt, as chat messages."""
    if not uses_tool:
        return [{"role": "assistant", "content": format_answer(value)}]
    return [
        {"role": "assistant", "content": tool_call_text(expression)},
        {"role": "tool", "content": str(value)},
        {"role": "assistant", "content": format_answer(value)},
    ]


def chatml_continuation(messages: Sequence[dict[str, str]]) -> str:
    """The continuation as ChatML text, without the final EOS (the SFT trainer appends it): each
    message after the first closes the previous one and opens its own role line."""
    text = messages[0]["content"]
    for message in messages[1:]:
        text += f"<|im_end|>\n<|im_start|>{message['role']}\n{message['content']}"
    return text


def draw_problems(count: int, *, digits: tuple[int, int], seed: int) -> list[tuple[int, int]]:
    """`count` distinct (a, b) pairs with a digit count drawn uniformly in `digits` for each operand."""
    low, high = digits
    if not 1 <= low <= high:
        raise ValueError(f"digits must satisfy 1 <= min <= max, got {digits}")
    rng, seen = random.Random(seed), {}
    for _ in range(50 * count + 1000):
        if len(seen) == count:
            break
        a, b = (
            rng.randint(10 ** (d - 1), 10**d - 1) for d in (rng.randint(low, high), rng.randint(low, high))
        )
        seen[(a, b)] = None
    if len(seen) < count:
        raise ValueError(f"found only {len(seen)} distinct problems of {count}; widen digits")
    return list(seen)


def tool_row(
    a: int, b: int, *, split: str, index: int, uses_tool: bool, with_instruction: bool = True
) -> dict[str, Any]:
    expression, value = f"{a}*{b}", a * b
    question = f"What is {expression}?"
    messages = demonstration(expression, value, uses_tool=uses_tool)
    system = [{"role": "system", "content": SYSTEM_PROMPT}] if with_instruction else []
    return {
        "data_source": DATA_SOURCE,
        "agent_name": "tool_agent",
        "prompt": [*system, {"role": "user", "content": question}],
        "ability": "arithmetic_tool",
        "reward_model": {"style": "rule", "ground_truth": str(value)},
        "extra_info": {
            "split": split,
            "index": index,
            "expression": expression,
            "question": question,
            "uses_tool": uses_tool,
            "answer": chatml_continuation(messages),
            "answer_messages": messages,
        },
    }


def write_tool_config(path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(TOOL_CONFIG, sort_keys=False), encoding="utf-8")
    return out


def make_tool_dataset(
    out_dir: str | Path,
    *,
    n_train: int,
    n_test: int,
    digits: tuple[int, int] = (3, 4),
    tool_fraction: float = 0.5,
    with_instruction: bool = True,
    seed: int = 0,
) -> dict[str, Path]:
    """Write train.parquet, test.parquet and tools.yaml; returns {"train", "test", "tools"} paths.
    A seeded `round(tool_fraction · n_train)` of the training rows demonstrate the tool.
    `with_instruction=False` drops the system message (a tiny model learns the format from the
    demonstrations, and a short prompt keeps the operands close to where it copies them)."""
    if not 0.0 <= tool_fraction <= 1.0:
        raise ValueError(f"tool_fraction must be in [0, 1], got {tool_fraction}")
    problems = draw_problems(n_test + n_train, digits=digits, seed=seed)
    test, train = problems[:n_test], problems[n_test:]
    with_tool = set(random.Random(seed + 1).sample(range(n_train), round(tool_fraction * n_train)))
    out = Path(out_dir)
    rows = {
        "test": [
            tool_row(a, b, split="test", index=i, uses_tool=True, with_instruction=with_instruction)
            for i, (a, b) in enumerate(test)
        ],
        "train": [
            tool_row(
                a, b, split="train", index=i, uses_tool=i in with_tool, with_instruction=with_instruction
            )
            for i, (a, b) in enumerate(train)
        ],
    }
    paths = {split: write_rows(out / f"{split}.parquet", split_rows) for split, split_rows in rows.items()}
    return {"train": paths["train"], "test": paths["test"], "tools": write_tool_config(out / "tools.yaml")}


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of `stratarl data make tool_arithmetic`, for a parser the CLI owns."""
    parser.add_argument(
        "--out", required=True, type=Path, help="directory for the parquet files and tools.yaml"
    )
    parser.add_argument("--n-train", type=int, default=2000, help="training prompts")
    parser.add_argument("--n-test", type=int, default=200, help="held-out prompts")
    parser.add_argument(
        "--digits", type=int, nargs="+", default=[3, 4], metavar="D", help="one value or MIN MAX"
    )
    parser.add_argument(
        "--tool-fraction", type=float, default=0.5, help="share of SFT rows that use the tool"
    )
    parser.add_argument("--no-instruction", action="store_true", help="omit the system message")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def run_from_args(args: argparse.Namespace) -> int:
    if len(args.digits) not in (1, 2):
        raise SystemExit(f"--digits takes one value or MIN MAX, got {args.digits}")
    paths = make_tool_dataset(
        args.out,
        n_train=args.n_train,
        n_test=args.n_test,
        digits=(args.digits[0], args.digits[-1]),
        tool_fraction=args.tool_fraction,
        with_instruction=not args.no_instruction,
        seed=args.seed,
    )
    for name, path in paths.items():
        print(f"wrote {name}: {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Write the tool-use arithmetic task as verl-schema parquet plus its tools.yaml."""
    parser = argparse.ArgumentParser(prog="stratarl data make tool_arithmetic", description=main.__doc__)
    return run_from_args(add_arguments(parser).parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
