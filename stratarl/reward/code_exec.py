"""Layer 5, rewards: score model-written programs by running them on test cases in the sandbox.

The program is the last ```python fenced block of the response (or the whole response when it has
no fence). The ground truth holds stdin/stdout test cases as APPS/CodeContests do:
`{"inputs": ["1 2\\n", ...], "outputs": ["3\\n", ...]}` (a dict or its JSON string). A case passes
when the program exits 0 and its stdout equals the expected output up to trailing whitespace on
each line and blank lines at the end. `continuous=False` scores 1 only when every case passes and
stops at the first failure; `continuous=True` scores the fraction of cases passed.
"""

from __future__ import annotations

import json
import re
from typing import Any

from stratarl.reward.sandbox import SandboxLimits, run_python

_FENCE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_program(solution_str: str) -> str:
    """The last fenced code block, or the whole response when there is none."""
    blocks = _FENCE.findall(solution_str)
    return blocks[-1] if blocks else solution_str


def normalize_output(text: str) -> str:
    """Lines with trailing whitespace removed, trailing blank lines dropped."""
    return "\n".join(line.rstrip() for line in text.rstrip().splitlines())


def parse_test_cases(ground_truth: Any) -> list[tuple[str, str]]:
    """[(stdin, expected stdout)] from a dict or JSON string with equal-length inputs/outputs."""
    cases = json.loads(ground_truth) if isinstance(ground_truth, str | bytes) else ground_truth
    if not isinstance(cases, dict) or "inputs" not in cases or "outputs" not in cases:
        raise ValueError("code ground truth must be {'inputs': [...], 'outputs': [...]}")
    inputs, outputs = list(cases["inputs"]), list(cases["outputs"])
    if len(inputs) != len(outputs) or not inputs:
        raise ValueError(f"code ground truth has {len(inputs)} inputs and {len(outputs)} outputs")
    return [(str(i), str(o)) for i, o in zip(inputs, outputs, strict=True)]


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    *,
    continuous: bool = False,
    limits: SandboxLimits | None = None,
) -> dict[str, Any]:
    """Run the program on each case; extras: `passed`, `total`, `first_failure` (a sandbox status,
    "wrong_answer", or "" when everything passed)."""
    program = extract_program(solution_str)
    cases = parse_test_cases(ground_truth)
    passed, first_failure = 0, ""
    for stdin, expected in cases:
        result = run_python(program, stdin=stdin, limits=limits)
        if result.ok and normalize_output(result.stdout) == normalize_output(expected):
            passed += 1
            continue
        first_failure = first_failure or (result.status if not result.ok else "wrong_answer")
        if not continuous:
            break
    all_passed = passed == len(cases)
    score = passed / len(cases) if continuous else float(all_passed)
    return {
        "score": score,
        "acc": float(all_passed),
        "passed": float(passed),
        "total": float(len(cases)),
        "first_failure": first_failure,
    }
