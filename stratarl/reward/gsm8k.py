"""Layer 5, rewards: GSM8K-style answers, `#### 72` (strict) or the last number (flexible).

As verl's gsm8k scorer (ReFT, Luong et al., ACL 2024): only the last 300 characters are searched
(the answer sits at the end, and regexes on long strings are slow); strict takes the last
`#### <number>` with thousands commas and `$` removed; flexible takes the last number-like token.
The extracted string must equal the ground truth exactly ("72" ≠ "72.0").
"""

from __future__ import annotations

import re
from typing import Any

DATA_SOURCES = ("openai/gsm8k", "gsm8k")
CLIP_CHARS = 300
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_NUMBER = re.compile(r"(\-?[0-9\.\,]+)")


def extract_answer(solution_str: str, method: str = "strict") -> str | None:
    """The answer string of a response, or None; method is "strict" or "flexible"."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"gsm8k method must be 'strict' or 'flexible', got {method!r}")
    tail = solution_str[-CLIP_CHARS:]
    if method == "strict":
        found = _STRICT.findall(tail)
        return found[-1].replace(",", "").replace("$", "") if found else None
    candidates = [token for token in _NUMBER.findall(tail) if token not in ("", ".")]
    return candidates[-1] if candidates else None


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    *,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> dict[str, float]:
    """`score` for the right answer, `format_score` for a wrong but extractable one, else 0."""
    answer = extract_answer(solution_str, method)
    is_correct = answer is not None and answer == str(ground_truth).strip()
    value = score if is_correct else (format_score if answer is not None else 0.0)
    return {"score": value, "acc": float(is_correct), "format_ok": float(answer is not None)}
