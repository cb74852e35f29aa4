"""Layer 5, rewards: the answer rule of the tool-use arithmetic task (`stratarl.data.tasks.tool_arithmetic`).

A multi-turn response may call the calculator any number of times; it is correct when its text
ENDS with `Answer: <integer>` (the canonical integer form of `stratarl.reward.arithmetic`) and the
integer equals the ground truth. Only the end counts, so an answer written before a tool call, or
a number echoed from a tool result, earns nothing. Works on either decoding of the response:
action tokens only, or the whole response with observations.
"""

from __future__ import annotations

import re
from typing import Any

DATA_SOURCE = "tool_arithmetic"
TOOL_CALL_OPEN = "<tool_call>"
# "Answer:" at the start, after whitespace, or right after a tag: decoding only the action tokens
# joins turns with nothing between them ("...</tool_call>Answer: 42").
_FINAL_ANSWER = re.compile(r"(?:^|[\s>])Answer: (0|-?[1-9][0-9]*)\s*$")


def parse_final_answer(solution_str: str) -> int | None:
    """The integer of a trailing `Answer: N`, or None."""
    match = _FINAL_ANSWER.search(solution_str)
    return int(match.group(1)) if match else None


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> dict[str, float]:
    """1.0 for the right final answer; extras `acc`, `format_ok` and `used_tool` become metrics."""
    predicted = parse_final_answer(solution_str)
    is_correct = predicted is not None and predicted == int(str(ground_truth).strip())
    return {
        "score": float(is_correct),
        "acc": float(is_correct),
        "format_ok": float(predicted is not None),
        "used_tool": float(TOOL_CALL_OPEN in solution_str),
    }
