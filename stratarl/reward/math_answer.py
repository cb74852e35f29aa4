"""Layer 5, rewards: math answers checked with `math-verify` (boxed answers, fractions, LaTeX, sets).

The ground truth is wrapped as `\\boxed{...}` and parsed as LaTeX; the response is parsed both as
LaTeX and as a plain expression, and the two are compared symbolically (as verl's math_verify
scorer does). math-verify's own timeouts use `signal.alarm`, which works only in a process's main
thread, so they are switched off here (`parsing_timeout=None`, `timeout_seconds=None`) and the time
limit is enforced from outside by the process pool of `stratarl.reward.process_pool`.
"""

from __future__ import annotations

import logging
from typing import Any

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

# math-verify warns on every call that its timeouts are off; ours are enforced by the pool.
logging.getLogger("math_verify").setLevel(logging.ERROR)
_GOLD_TARGETS = (LatexExtractionConfig(),)
_PRED_TARGETS = (ExprExtractionConfig(), LatexExtractionConfig())


def is_equivalent(solution_str: str, ground_truth: str) -> tuple[bool, bool]:
    """(the response's final answer equals the ground truth, an answer was found in the response)."""
    gold = parse(f"\\boxed{{{ground_truth}}}", extraction_config=_GOLD_TARGETS, parsing_timeout=None)
    predicted = parse(solution_str, extraction_config=_PRED_TARGETS, parsing_timeout=None)
    if not gold or not predicted:
        return False, bool(predicted)
    return bool(verify(gold, predicted, timeout_seconds=None)), True


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> dict[str, float]:
    """1.0 when math-verify finds the response's answer equal to the ground truth, else 0."""
    is_correct, found = is_equivalent(solution_str, str(ground_truth))
    return {"score": float(is_correct), "acc": float(is_correct), "format_ok": float(found)}
