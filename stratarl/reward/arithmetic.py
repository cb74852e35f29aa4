"""Layer 5, rewards: the strict answer format of the synthetic arithmetic task, and its scorer.

A response is correct only when it is exactly `Answer: <integer>` (surrounding whitespace aside) and
the integer equals the ground truth. The task writer (`stratarl.data.tasks.arithmetic`) builds its
reference responses with `format_answer`, so writer and scorer share one definition of the format.
"""

from __future__ import annotations

import re
from typing import Any

DATA_SOURCE = "arithmetic"
ANSWER_PREFIX = "Answer: "
# Canonical integers only: no leading zeros, no "+", no "-0", ASCII digits only (\d would admit "٣").
_ANSWER = re.compile(r"Answer: (0|-?[1-9][0-9]*)")


def format_answer(value: int) -> str:
    """The one accepted response for `value`: `format_answer(-12) == "Answer: -12"`."""
    return f"{ANSWER_PREFIX}{int(value)}"


def parse_answer(solution_str: str) -> int | None:
    """The integer of a well-formed response, or None when the format is off.

    Leading/trailing whitespace is ignored (a decoded response may end in a newline); anything else
    around the answer — a second answer, reasoning text, a missing space, "Answer: 07" — is a
    format error. Strictness keeps the reward unhackable by emitting many numbers.
    """
    match = _ANSWER.fullmatch(solution_str.strip())
    return int(match.group(1)) if match else None


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    *,
    format_score: float = 0.0,
) -> dict[str, float]:
    """verl-signature scorer: 1.0 for the right integer in the right format, else 0.

    `format_score` (default 0, i.e. off) is paid for a well-formed but wrong answer; a small value
    such as 0.1 can help a model that has not yet learned the format, at the cost of a reward that
    no longer equals accuracy. The returned extras `acc` and `format_ok` become metrics.
    A ground truth that is not an integer raises ValueError, which the batch scorer counts.
    """
    predicted = parse_answer(solution_str)
    is_formatted = predicted is not None
    is_correct = is_formatted and predicted == int(str(ground_truth).strip())
    score = 1.0 if is_correct else (format_score if is_formatted else 0.0)
    return {"score": score, "acc": float(is_correct), "format_ok": float(is_formatted)}
