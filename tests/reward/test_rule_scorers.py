"""GSM8K (strict/flexible), math-verify, the tool task's final answer, and DAPO's overlong penalty."""

import pytest
import torch

from stratarl.reward import gsm8k, tool_arithmetic
from stratarl.reward.batch_scorer import RewardResult
from stratarl.reward.overlong import overlong_penalty, with_overlong_penalty


@pytest.mark.parametrize(
    ("text", "strict", "flexible"),
    [
        ("so the total is #### 1,234", "1234", "1,234"),
        ("#### $56", None, "56"),  # strict wants a digit right after "#### "
        ("first #### 3 then #### 4.", "4.", "4."),
        ("no number here", None, None),
        ("value -7 and .", None, "-7"),  # "." alone is skipped by flexible
        ("x" * 400 + "#### 9", "9", "9"),
        ("#### 9" + "x" * 400, None, None),  # only the last 300 characters are searched
    ],
)
def test_gsm8k_extraction(text, strict, flexible):
    assert gsm8k.extract_answer(text, "strict") == strict
    assert gsm8k.extract_answer(text, "flexible") == flexible


def test_gsm8k_score_and_format_score():
    assert gsm8k.compute_score("openai/gsm8k", "#### 72", "72")["score"] == 1.0
    assert gsm8k.compute_score("openai/gsm8k", "#### 72.0", "72")["score"] == 0.0  # exact string match
    wrong = gsm8k.compute_score("openai/gsm8k", "#### 71", "72", format_score=0.1)
    assert (wrong["score"], wrong["format_ok"], wrong["acc"]) == (0.1, 1.0, 0.0)
    assert gsm8k.compute_score("gsm8k", "72", "72", method="flexible")["score"] == 1.0
    with pytest.raises(ValueError, match="strict"):
        gsm8k.extract_answer("1", "loose")


@pytest.mark.parametrize(
    ("text", "truth", "correct"),
    [
        ("The answer is \\boxed{68}", "68", True),
        ("$\\frac{1}{2}$", "0.5", True),
        ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", True),
        ("so x = \\boxed{3\\sqrt{2}}", "\\sqrt{18}", True),
        ("\\boxed{67}", "68", False),
        ("no answer", "68", False),
    ],
)
def test_math_verify_scorer(text, truth, correct):
    from stratarl.reward.math_answer import compute_score

    assert compute_score("math", text, truth)["score"] == float(correct)


def test_math_verify_works_outside_the_main_thread():
    from concurrent.futures import ThreadPoolExecutor

    from stratarl.reward.math_answer import compute_score

    with ThreadPoolExecutor(1) as pool:  # math-verify's signal-based timeout would raise here
        assert pool.submit(compute_score, "math", "\\boxed{4}", "4").result()["score"] == 1.0


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ('<tool_call>{"name": "calculator"}</tool_call>Answer: 42', 42),
        ("Answer: 41\nAnswer: 42\n", 42),  # only the end counts
        ("Answer: 42 and more", None),
        ("Answer: 042", None),
        ("tool\n42\nassistant\nAnswer: -3", -3),  # the whole response, observations included
    ],
)
def test_tool_task_final_answer(text, answer):
    assert tool_arithmetic.parse_final_answer(text) == answer


def test_tool_task_score_extras():
    out = tool_arithmetic.compute_score("tool_arithmetic", '<tool_call>{"a": 1}</tool_call>Answer: 6', "6")
    assert out == {"score": 1.0, "acc": 1.0, "format_ok": 1.0, "used_tool": 1.0}
    assert tool_arithmetic.compute_score("tool_arithmetic", "Answer: 5", "6")["used_tool"] == 0.0


def test_overlong_penalty_by_hand():
    # L_max = 10, L_buf = 4: free up to 6 tokens, then −(L − 6)/4 · factor
    lengths = torch.tensor([3, 6, 7, 8, 10])
    penalty = overlong_penalty(lengths, max_response_length=10, buffer_length=4, penalty_factor=2.0)
    assert penalty.tolist() == [0.0, 0.0, -0.5, -1.0, -2.0]
    with pytest.raises(ValueError, match="buffer_length"):
        overlong_penalty(lengths, max_response_length=10, buffer_length=0)


def test_overlong_penalty_on_a_reward_result():
    result = RewardResult(torch.tensor([1.0, 0.0]), {"acc": [1.0, 0.0]}, {"KeyError": 1})
    out = with_overlong_penalty(result, torch.tensor([5, 10]), max_response_length=10, buffer_length=5)
    assert out.scores.tolist() == [1.0, -1.0]
    assert out.extra["overlong_reward"] == [0.0, -1.0] and out.extra["overlong"] == [0.0, 1.0]
    assert out.failures == {"KeyError": 1} and result.scores.tolist() == [1.0, 0.0]  # input unchanged
