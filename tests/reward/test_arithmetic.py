"""Arithmetic scorer: only `Answer: <canonical integer>` counts; hand cases for each way to miss."""

import pytest

from stratarl.reward.arithmetic import compute_score, format_answer, parse_answer


@pytest.mark.parametrize(
    ("response", "truth", "score"),
    [
        ("Answer: 68", "68", 1.0),
        ("Answer: -12", "-12", 1.0),
        ("Answer: 0", "0", 1.0),
        ("  Answer: 68\n", "68", 1.0),  # surrounding whitespace is ignored
        ("Answer: 68", 68, 1.0),  # an int ground truth works too
        ("Answer: 67", "68", 0.0),  # right format, wrong answer
        ("68", "68", 0.0),  # bare number: wrong format
        ("answer: 68", "68", 0.0),
        ("Answer:68", "68", 0.0),
        ("Answer: 068", "68", 0.0),  # leading zero is not canonical
        ("Answer: +68", "68", 0.0),
        ("Answer: -0", "0", 0.0),
        ("Answer: 68.0", "68", 0.0),
        ("Answer: 6 8", "68", 0.0),
        ("Answer: 68 Answer: 68", "68", 0.0),  # repeating the answer is not allowed
        ("The sum is 68. Answer: 68", "68", 0.0),  # no text around the answer
        ("Answer: ٦٨", "68", 0.0),  # non-ASCII digits
        ("", "68", 0.0),
    ],
)
def test_strict_format(response, truth, score):
    result = compute_score("arithmetic", response, truth)
    assert result["score"] == score
    assert result["acc"] == score


def test_extras_and_optional_format_score():
    assert compute_score("arithmetic", "Answer: 5", "6") == {"score": 0.0, "acc": 0.0, "format_ok": 1.0}
    assert compute_score("arithmetic", "5", "6") == {"score": 0.0, "acc": 0.0, "format_ok": 0.0}
    assert compute_score("arithmetic", "Answer: 5", "6", format_score=0.1)["score"] == 0.1
    assert compute_score("arithmetic", "five", "6", format_score=0.1)["score"] == 0.0
    assert compute_score("arithmetic", "Answer: 6", "6", format_score=0.1)["score"] == 1.0


def test_format_and_parse_are_inverse():
    for value in (-1001, -1, 0, 7, 123456789):
        assert parse_answer(format_answer(value)) == value


def test_non_integer_ground_truth_raises():
    with pytest.raises(ValueError):
        compute_score("arithmetic", "Answer: 1", "one")
