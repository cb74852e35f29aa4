"""The shaped arithmetic reward of the SmolLM2 recipe (recipes/rewards/arithmetic_answer_line.py),
case by case: full credit only for a reply ending with the right `Answer: N`, partial credit below."""

from pathlib import Path

import pytest

from stratarl.reward.custom import load_custom_scorer

REWARD = Path(__file__).resolve().parents[2] / "recipes" / "rewards" / "arithmetic_answer_line.py"


@pytest.mark.parametrize(
    ("reply", "score", "acc", "correct", "format_ok", "exact"),
    [
        ("Answer: 15", 1.0, 1, 1, 1, 1),  # the strict reply of stratarl.reward.arithmetic
        ("7 + 8 = 15\nAnswer: 15.", 1.0, 1, 1, 1, 0),  # working, then the answer line
        ("7 + 8 = 15. Answer: 15", 1.0, 1, 1, 1, 0),
        ("7 + 8 = 15", 0.5, 0, 1, 0, 0),  # right last number, no answer line
        ("Answer: 15, I think", 0.5, 0, 1, 0, 0),  # the line must end the reply
        ("7 + 8 = 16\nAnswer: 16", 0.2, 0, 0, 1, 0),  # the format alone
        ("Answer: 015", 0.5, 0, 1, 0, 0),  # no answer line (015 is not canonical), but the last number is 15
        ("Answer: 14 ... Answer: 15", 1.0, 1, 1, 1, 0),
        ("I cannot say.", 0.0, 0, 0, 0, 0),
    ],
)
def test_scores_by_case(reply, score, acc, correct, format_ok, exact):
    result = load_custom_scorer(REWARD, "compute_score")("arithmetic", reply, "15")
    assert result == {"score": score, "acc": acc, "correct": correct, "format_ok": format_ok, "exact": exact}
