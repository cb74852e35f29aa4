"""Layer 5, rewards: score a batch of N decoded responses, one scorer call per sample.

A scorer that raises, or returns something that is not a finite number (or a dict with one under
`score`), gives 0 for that sample and a counted failure reason; the batch — and the run — goes
on. A data source with no scorer is a setup error and is raised, because scoring a whole run as 0
would hide it.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

import numpy as np
import torch
from torch import Tensor

from stratarl.reward.registry import ScoreFn, UnknownDataSourceError, default_compute_score

logger = logging.getLogger(__name__)


@dataclass
class RewardResult:
    """Scores of one batch, the scorers' extra outputs and what went wrong.

    scores: [N] float32, one outcome per trajectory (0 where the scorer failed).
    extra: key -> [N] list of the extra values scorers returned in their dicts (None where absent).
    failures: reason -> count; reasons are the raised exception's class name, `bad_return`, `non_finite`.
    failure_examples: the first few failures as "sample i: reason: message", for logs.
    """

    scores: Tensor
    extra: dict[str, list[Any]] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    failure_examples: list[str] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        """`reward/failures/<reason>` counts (and their total) and `reward/<key>/mean` of numeric extras."""
        out = {f"reward/failures/{reason}": float(count) for reason, count in sorted(self.failures.items())}
        out["reward/failures/total"] = float(sum(self.failures.values()))
        for key, values in self.extra.items():
            numbers = [float(v) for v in values if isinstance(v, Real) and math.isfinite(float(v))]
            if numbers:
                out[f"reward/{key}/mean"] = sum(numbers) / len(numbers)
        return out


def score_batch(
    data_sources: Sequence[str],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[dict | None] | None = None,
    *,
    compute_score: ScoreFn = default_compute_score,
    max_examples: int = 3,
) -> RewardResult:
    """Call `compute_score(data_source, solution_str, ground_truth, extra_info)` for each of N samples."""
    n = len(solution_strs)
    if not len(data_sources) == len(ground_truths) == n:
        raise ValueError(
            f"score_batch needs N equal lengths: data_sources={len(data_sources)}, "
            f"solution_strs={n}, ground_truths={len(ground_truths)}"
        )
    infos = list(extra_infos) if extra_infos is not None else [None] * n
    if len(infos) != n:
        raise ValueError(f"score_batch: extra_infos has {len(infos)} rows, expected {n}")

    scores = torch.zeros(n, dtype=torch.float32)  # [N]
    extra: dict[str, list[Any]] = {}
    failures: Counter[str] = Counter()
    examples: list[str] = []
    for i in range(n):
        score, extras, reason, message = _score_one(
            compute_score, data_sources[i], solution_strs[i], ground_truths[i], infos[i]
        )
        scores[i] = score
        for key, value in extras.items():
            extra.setdefault(key, [None] * n)[i] = value
        if reason is not None:
            failures[reason] += 1
            if len(examples) < max_examples:
                examples.append(f"sample {i} ({data_sources[i]}): {reason}: {message}")
    if failures:
        logger.warning("reward failures %s; first: %s", dict(failures), "; ".join(examples))
    return RewardResult(scores, extra, dict(failures), examples)


def _score_one(
    compute_score: ScoreFn, data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None
) -> tuple[float, dict[str, Any], str | None, str]:
    """(score, extras, failure reason or None, message) for one sample; never raises except setup errors."""
    try:
        result = compute_score(data_source, solution_str, ground_truth, extra_info)
    except UnknownDataSourceError:
        raise
    except Exception as err:
        return 0.0, {}, type(err).__name__, str(err)[:200]

    extras: dict[str, Any] = {}
    if isinstance(result, dict):
        extras = {key: value for key, value in result.items() if key != "score"}
        if "score" not in result:
            return 0.0, extras, "bad_return", f"dict without 'score' (keys {sorted(result)})"
        result = result["score"]
    if isinstance(result, np.generic) or (isinstance(result, Tensor) and result.numel() == 1):
        result = result.item()  # numpy and one-element torch scalars (np.bool_ is not a Real)
    if not isinstance(result, Real):  # bool, int, float
        return 0.0, extras, "bad_return", f"score of type {type(result).__name__}"
    if not math.isfinite(float(result)):
        return 0.0, extras, "non_finite", f"score {result}"
    return float(result), extras, None, ""
