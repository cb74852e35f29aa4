"""Layer 5, rewards: score a batch of N decoded responses, one scorer call per sample, in-process.

A scorer that raises, or returns something that is not a finite number (or a dict with one under
`score`), gives 0 for that sample and a counted failure reason (`score_call`); the batch — and the
run — goes on. A data source with no scorer is a setup error and is raised, because scoring a whole
run as 0 would hide it. In-process scoring has no deadline and cannot survive `os._exit`: the
trainer's default is `process_pool.ScoringPool`, which returns the same `RewardResult`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from stratarl.reward.registry import ScoreFn, default_compute_score
from stratarl.reward.score_call import ScoreOutcome, call_scorer, finite_float

logger = logging.getLogger(__name__)


@dataclass
class RewardResult:
    """Scores of one batch, the scorers' extra outputs and what went wrong.

    scores: [N] float32, one outcome per trajectory (0, or the configured failure score, where the
        scorer failed).
    extra: key -> [N] list of the extra values scorers returned in their dicts (None where absent).
    failures: reason -> count; reasons are the raised exception's class name (`SystemExit`
        included), `bad_return`, `non_finite`, and from worker processes `timeout`, `process_exit`,
        `process_crash`, `pool_broken`.
    failure_examples: the first few failures as "sample i: reason: message", for logs.
    sample_failures: [N] each sample's reason, None where it was scored.
    sample_messages: [N] each failed sample's message (the exception's text, the deadline), "" else.
    data_sources: [N] each sample's data source (failures are counted per source too).
    output_bytes: what the scorers printed in all (worker processes count it; in-process: 0).
    capped_outputs: calls that printed more than the per-call cap kept.
    """

    scores: Tensor
    extra: dict[str, list[Any]] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    failure_examples: list[str] = field(default_factory=list)
    sample_failures: list[str | None] = field(default_factory=list)
    sample_messages: list[str] = field(default_factory=list)
    data_sources: list[str] = field(default_factory=list)
    output_bytes: int = 0
    capped_outputs: int = 0

    def metrics(self) -> dict[str, float]:
        """`reward/failures/<reason>` and `reward/failures/<data_source>/<reason>` counts (and their
        total), `reward/output/{bytes,capped_calls}`, and `reward/<key>/mean` of numeric extras."""
        out = {f"reward/failures/{reason}": float(count) for reason, count in sorted(self.failures.items())}
        out["reward/failures/total"] = float(sum(self.failures.values()))
        by_source = Counter(
            (source, reason)
            for source, reason in zip(self.data_sources, self.sample_failures, strict=False)
            if reason is not None
        )
        for (source, reason), count in sorted(by_source.items()):
            out[f"reward/failures/{source}/{reason}"] = float(count)
        out["reward/output/bytes"] = float(self.output_bytes)
        out["reward/output/capped_calls"] = float(self.capped_outputs)
        for key, values in self.extra.items():
            numbers = [number for v in values if (number := finite_float(v)) is not None]
            if numbers:
                out[f"reward/{key}/mean"] = sum(numbers) / len(numbers)
        return out

    def with_failure_score(self, value: float) -> RewardResult:
        """This result with `value` as the score of every failed sample (reward.failure_score)."""
        failed = torch.tensor([r is not None for r in self.sample_failures], dtype=torch.bool)
        if value == 0.0 or not failed.any():
            return self
        scores = torch.where(failed, torch.full_like(self.scores, value), self.scores)
        return dataclasses.replace(self, scores=scores)


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
    printed = [o for o in outcomes if o.output_bytes]
    capped = sum(o.output_bytes > len(o.output_head.encode("utf-8")) for o in printed)
    if printed:  # once per batch, however much was printed: the log stays small
        logger.info(
            "scorers printed %d bytes in %d of %d calls (%d over the per-call cap, the rest dropped); "
            "the first: %r",
            sum(o.output_bytes for o in printed),
            len(printed),
            n,
            capped,
            printed[0].output_head[:200],
        )
    return RewardResult(
        scores,
        extra,
        dict(failures),
        examples,
        sample_failures=[o.reason for o in outcomes],
        sample_messages=[o.message if o.reason is not None else "" for o in outcomes],
        data_sources=[str(s) for s in data_sources],
        output_bytes=sum(o.output_bytes for o in outcomes),
        capped_outputs=capped,
    )


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
