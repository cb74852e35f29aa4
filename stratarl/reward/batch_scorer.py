"""Layer 5, rewards: score a batch of N decoded responses, one scorer call per sample, in-process.

A scorer that raises, or returns something that is not a finite number (or a dict with one under
`score`), gives 0 for that sample and a counted failure reason (`score_call`); the batch — and the
run — goes on. A data source with no scorer is a setup error and is raised, because scoring a whole
run as 0 would hide it. For concurrency and per-sample timeouts use `process_pool.ScoringPool`,
which returns the same `RewardResult`.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

import torch
from torch import Tensor

from stratarl.reward.registry import ScoreFn, default_compute_score
from stratarl.reward.score_call import ScoreOutcome, call_scorer

logger = logging.getLogger(__name__)


@dataclass
class RewardResult:
    """Scores of one batch, the scorers' extra outputs and what went wrong.

    scores: [N] float32, one outcome per trajectory (0 where the scorer failed).
    extra: key -> [N] list of the extra values scorers returned in their dicts (None where absent).
    failures: reason -> count; reasons are the raised exception's class name, `bad_return`,
        `non_finite`, and from the process pool `timeout` and `worker_died`.
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


def check_lengths(
    data_sources: Sequence[str],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[dict | None] | None,
) -> list[dict | None]:
    """The extra_infos as a list of N (None rows when not given); raise unless all have N rows."""
    n = len(solution_strs)
    if not len(data_sources) == len(ground_truths) == n:
        raise ValueError(
            f"score_batch needs N equal lengths: data_sources={len(data_sources)}, "
            f"solution_strs={n}, ground_truths={len(ground_truths)}"
        )
    infos = list(extra_infos) if extra_infos is not None else [None] * n
    if len(infos) != n:
        raise ValueError(f"score_batch: extra_infos has {len(infos)} rows, expected {n}")
    return infos


def collect_outcomes(
    outcomes: Sequence[ScoreOutcome], data_sources: Sequence[str], max_examples: int = 3
) -> RewardResult:
    """Stack N per-sample outcomes into a `RewardResult` (and log the failures once)."""
    n = len(outcomes)
    scores = torch.tensor([o.score for o in outcomes], dtype=torch.float32).reshape(n)  # [N]
    extra: dict[str, list[Any]] = {}
    failures: Counter[str] = Counter()
    examples: list[str] = []
    for i, outcome in enumerate(outcomes):
        for key, value in outcome.extras.items():
            extra.setdefault(key, [None] * n)[i] = value
        if outcome.reason is not None:
            failures[outcome.reason] += 1
            if len(examples) < max_examples:
                examples.append(f"sample {i} ({data_sources[i]}): {outcome.reason}: {outcome.message}")
    if failures:
        logger.warning("reward failures %s; first: %s", dict(failures), "; ".join(examples))
    return RewardResult(scores, extra, dict(failures), examples)


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
    infos = check_lengths(data_sources, solution_strs, ground_truths, extra_infos)
    outcomes = [
        call_scorer(compute_score, data_sources[i], solution_strs[i], ground_truths[i], infos[i])
        for i in range(len(solution_strs))
    ]
    return collect_outcomes(outcomes, data_sources, max_examples)
