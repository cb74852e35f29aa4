"""Layer 5, rewards: score samples in worker processes, each call under its own deadline.

The default scoring path of the trainer (`reward.in_process=false`). `ScoringPool` runs
`compute_score` in the K workers of a `call_pool.CallPool`: a scorer that sleeps forever, loops in
C, raises SystemExit, calls `os._exit` or segfaults costs its sample 0 (and a counted reason:
`timeout`, `SystemExit`, `process_exit`, `process_crash`) and its worker, which is replaced; the
run goes on. What a scorer prints is counted and kept to `max_output_bytes` per call. Samples go in
with `submit` (a `Future` of a `ScoreOutcome`, for scoring as each trajectory finishes) or as a
whole batch with `score_batch` (a `RewardResult`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from stratarl.reward.batch_scorer import RewardResult, check_lengths, collect_outcomes
from stratarl.reward.call_pool import CallPool
from stratarl.reward.call_worker import CallResult
from stratarl.reward.registry import UnknownDataSourceError, default_compute_score
from stratarl.reward.sandbox_namespace import SandboxUnavailableError
from stratarl.reward.score_call import ScoreOutcome, ScorerCall

# Reasons that are setup errors, not per-sample failures: raised from the batch's result.
SETUP_ERRORS: dict[str, type[Exception]] = {
    "UnknownDataSourceError": UnknownDataSourceError,
    "SandboxUnavailableError": SandboxUnavailableError,
}


class ScoringPool:
    """K worker processes scoring with `compute_score` (picklable: a module-level function, a
    `LazyScorer`, a `FileScorer`, a `RemoteScorer` or a partial of one), `timeout_s` per sample."""

    def __init__(
        self,
        compute_score: Callable[..., Any] = default_compute_score,
        *,
        num_workers: int = 2,
        timeout_s: float = 30.0,
        max_examples: int = 3,
        max_output_bytes: int = 4096,
    ) -> None:
        self.compute_score, self.timeout_s, self.max_examples = compute_score, timeout_s, max_examples
        self._pool = CallPool(
            ScorerCall(compute_score),
            num_workers=num_workers,
            timeout_s=timeout_s,
            max_output_bytes=max_output_bytes,
            name="scoring-pool",
        )

    @property
    def restarts(self) -> int:
        return self._pool.restarts

    @property
    def broken(self) -> str | None:
        return self._pool.broken

    def submit(
        self, data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
    ) -> Future:
        """Queue one sample; the future resolves to a `ScoreOutcome`."""
        future: Future = Future()
        inner = self._pool.submit((data_source, solution_str, ground_truth, extra_info))
        inner.add_done_callback(lambda done: future.set_result(to_outcome(done.result())))
        return future

    def score_batch(
        self,
        data_sources: Sequence[str],
        solution_strs: Sequence[str],
        ground_truths: Sequence[Any],
        extra_infos: Sequence[dict | None] | None = None,
    ) -> RewardResult:
        """`score_batch` of `batch_scorer`, run concurrently with per-sample deadlines."""
        infos = check_lengths(data_sources, solution_strs, ground_truths, extra_infos)
        futures = [
            self.submit(*job) for job in zip(data_sources, solution_strs, ground_truths, infos, strict=True)
        ]
        return outcomes_to_result([f.result() for f in futures], data_sources, self.max_examples)

    def close(self) -> None:
        """Stop the workers; queued samples resolve as `pool_closed`."""
        self._pool.close()

    def __enter__(self) -> ScoringPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def to_outcome(result: CallResult) -> ScoreOutcome:
    """A worker's `CallResult` as the sample's `ScoreOutcome`, with what the call printed."""
    if result.reason is None and isinstance(result.value, ScoreOutcome):
        outcome = result.value
    elif result.reason is None:
        outcome = ScoreOutcome(0.0, {}, "bad_return", f"worker returned {type(result.value).__name__}")
    else:
        outcome = ScoreOutcome(0.0, {}, result.reason, result.message)
    outcome.output_bytes, outcome.output_head = result.output_bytes, result.output_head
    return outcome


def outcomes_to_result(
    outcomes: Sequence[ScoreOutcome], data_sources: Sequence[str], max_examples: int
) -> RewardResult:
    """A `RewardResult`; a setup error (no scorer for a data source, no sandbox) is raised here."""
    for outcome in outcomes:
        if outcome.reason in SETUP_ERRORS:
            raise SETUP_ERRORS[outcome.reason](outcome.message)
    return collect_outcomes(outcomes, data_sources, max_examples)
