"""The code-execution scorer: programs from responses run on stdin/stdout test cases in the sandbox."""

import json

import pytest

from stratarl.reward.code_exec import compute_score, extract_program, normalize_output, parse_test_cases
from stratarl.reward.registry import default_compute_score
from stratarl.reward.sandbox import SandboxLimits

CASES = json.dumps({"inputs": ["1 2\n", "5 7\n", "-3 3\n"], "outputs": ["3\n", "12", "0\n\n"]})
LIMITS = SandboxLimits(wall_seconds=3.0, cpu_seconds=2)


def response(body: str) -> str:
    return f"Here is my solution:\n```python\n{body}\n```\nDone."


def test_extract_and_normalize():
    assert extract_program("```py\nfirst\n```\n```python\nsecond\n```") == "second\n"
    assert extract_program("print(1)") == "print(1)"
    assert normalize_output("a  \nb\n\n\n") == "a\nb"
    with pytest.raises(ValueError, match="inputs"):
        parse_test_cases({"inputs": ["1"], "outputs": []})


def test_all_cases_pass():
    out = compute_score(
        "code", response("a, b = map(int, input().split())\nprint(a + b)"), CASES, limits=LIMITS
    )
    assert (out["score"], out["passed"], out["total"], out["first_failure"]) == (1.0, 3.0, 3.0, "")


def test_wrong_answer_stops_early_unless_continuous():
    body = "a, b = map(int, input().split())\nprint(a + b if a > 0 else 99)"
    strict = compute_score("code", response(body), CASES, limits=LIMITS)
    assert (strict["score"], strict["passed"], strict["first_failure"]) == (0.0, 2.0, "wrong_answer")
    partial = compute_score("code", response(body), CASES, continuous=True, limits=LIMITS)
    assert partial["score"] == pytest.approx(2 / 3) and partial["acc"] == 0.0


def test_hostile_programs_score_zero_with_the_reason():
    hang = compute_score("code", response("while True: pass"), CASES, limits=SandboxLimits(wall_seconds=0.5))
    assert (hang["score"], hang["first_failure"]) == (0.0, "timeout")
    crash = compute_score("code", response("import os\nos.fork()"), CASES, limits=LIMITS)
    assert (crash["score"], crash["first_failure"]) == (0.0, "error")


def test_registered_for_code_data_sources():
    assert (
        default_compute_score(
            "codecontests", response("print(int(input()) * 2)"), '{"inputs": ["4"], "outputs": ["8"]}'
        )["score"]
        == 1.0
    )
