"""Layer 5, rewards: score samples concurrently in worker processes, each with its own time limit.

A thread cannot be stopped and math-verify's own timeout needs the main thread, so scoring runs in
K spawned worker processes. A dispatcher thread hands one sample at a time to each idle worker and
starts that sample's clock when the worker takes it; a worker still busy after `timeout_s` is
killed and replaced, and its sample scores 0 with reason `timeout`. A worker that dies (a crash, an
`os._exit` in user code) gives `worker_died`. Samples go in with `submit` (a `Future`, for scoring
as each trajectory finishes) or as a whole batch with `score_batch` (a `RewardResult`).
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from stratarl.reward.batch_scorer import RewardResult, check_lengths, collect_outcomes
from stratarl.reward.registry import UnknownDataSourceError, default_compute_score
from stratarl.reward.score_call import ScoreOutcome, score_worker_main


@dataclass
class _Slot:
    """One worker process and the job it runs (None when idle)."""

    process: Any
    conn: Connection
    future: Future | None = None
    started: float = 0.0
    is_ready: bool = False  # the worker said "ready": its imports are done


class ScoringPool:
    """K worker processes scoring with `compute_score` (picklable: a module-level function, a
    `LazyScorer`, a `FileScorer` or a partial of one), `timeout_s` per sample."""

    def __init__(
        self,
        compute_score: Callable[..., Any] = default_compute_score,
        *,
        num_workers: int = 2,
        timeout_s: float = 30.0,
        max_examples: int = 3,
    ) -> None:
        if num_workers < 1 or timeout_s <= 0:
            raise ValueError(
                f"ScoringPool needs num_workers >= 1 and timeout_s > 0, got {num_workers}, {timeout_s}"
            )
        self.compute_score, self.timeout_s, self.max_examples = compute_score, timeout_s, max_examples
        self._context = multiprocessing.get_context("spawn")  # no fork of a process holding torch threads
        self._slots = [self._start_worker() for _ in range(num_workers)]
        self._queue: deque[tuple[tuple, Future]] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self.restarts = 0
        self.broken: str | None = None  # why the pool stopped by itself (a worker could not start)
        self._dispatcher = threading.Thread(target=self._dispatch, name="scoring-pool", daemon=True)
        self._dispatcher.start()

    def submit(
        self, data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
    ) -> Future:
        """Queue one sample; the future resolves to a `ScoreOutcome`."""
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(self.broken or "ScoringPool is closed")
            self._queue.append(((data_source, solution_str, ground_truth, extra_info), future))
        self._wake.set()
        return future

    def score_batch(
        self,
        data_sources: Sequence[str],
        solution_strs: Sequence[str],
        ground_truths: Sequence[Any],
        extra_infos: Sequence[dict | None] | None = None,
    ) -> RewardResult:
        """`score_batch` of `batch_scorer`, run concurrently with per-sample timeouts."""
        infos = check_lengths(data_sources, solution_strs, ground_truths, extra_infos)
        futures = [
            self.submit(*job) for job in zip(data_sources, solution_strs, ground_truths, infos, strict=True)
        ]
        return outcomes_to_result([f.result() for f in futures], data_sources, self.max_examples)

    def close(self) -> None:
        """Stop the dispatcher and the workers; queued samples resolve as `pool_closed`. A pool whose
        workers cannot start closes itself: queued samples resolve as `pool_broken`."""
        with self._lock:
            self._closed = True
        self._wake.set()
        self._dispatcher.join(timeout=10)
        for slot in self._slots:
            slot.process.kill()
            slot.process.join(timeout=5)

    def __enter__(self) -> ScoringPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- dispatcher thread -------------------------------------------------------------------
    def _start_worker(self) -> _Slot:
        parent, child = self._context.Pipe()
        process = self._context.Process(
            target=score_worker_main, args=(child, self.compute_score), daemon=True
        )
        process.start()
        child.close()
        return _Slot(process, parent)

    def _dispatch(self) -> None:
        while True:
            with self._lock:
                closed = self._closed
            if closed:
                self._drain_closed()
                return
            self._assign_idle()
            watched = {s.conn: s for s in self._slots if s.future is not None or not s.is_ready}
            sentinels = [s.process.sentinel for s in watched.values()]
            ready = wait([*watched, *sentinels], timeout=0.02) if watched else []
            for conn in (r for r in ready if r in watched):
                self._finish(watched[conn])
            self._reap(time.monotonic())
            if not watched:
                self._wake.wait(0.05)
                self._wake.clear()

    def _assign_idle(self) -> None:
        for slot in self._slots:
            if slot.future is not None or not slot.is_ready:
                continue
            with self._lock:
                if not self._queue:
                    return
                job, future = self._queue.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            slot.conn.send(job)
            slot.future, slot.started = future, time.monotonic()

    def _finish(self, slot: _Slot) -> None:
        try:
            outcome = slot.conn.recv()
        except (EOFError, OSError):
            return  # the worker died; _reap replaces it
        if outcome == "ready":
            slot.is_ready = True
            return
        future, slot.future = slot.future, None
        future.set_result(outcome)

    def _reap(self, now: float) -> None:
        """Replace workers that overran their sample's time limit or died."""
        for i, slot in enumerate(self._slots):
            if slot.future is None:
                if not slot.is_ready and slot.process.exitcode is not None:
                    # e.g. the scorer cannot be unpickled there: every sample would fail the same way
                    with self._lock:
                        self.broken = f"a scoring worker failed to start (exit code {slot.process.exitcode})"
                        self._closed = True
                continue
            overran = now - slot.started > self.timeout_s
            if not overran and slot.process.is_alive():
                continue
            slot.process.kill()
            slot.process.join(timeout=5)
            reason = "timeout" if overran else "worker_died"
            message = (
                f"no result after {self.timeout_s:g} s" if overran else f"exit code {slot.process.exitcode}"
            )
            self._slots[i] = self._start_worker()
            self.restarts += 1
            slot.future.set_result(ScoreOutcome(0.0, {}, reason, message))

    def _drain_closed(self) -> None:
        reason = "pool_broken" if self.broken else "pool_closed"
        for slot in self._slots:
            if slot.future is not None:
                slot.future.set_result(
                    ScoreOutcome(0.0, {}, reason, self.broken or "pool closed while scoring")
                )
        with self._lock:
            queued, self._queue = list(self._queue), deque()
        for _, future in queued:
            future.set_result(ScoreOutcome(0.0, {}, reason, self.broken or "pool closed before scoring"))


def outcomes_to_result(
    outcomes: Sequence[ScoreOutcome], data_sources: Sequence[str], max_examples: int
) -> RewardResult:
    """A `RewardResult`; a missing scorer for a data source is a setup error and raised here."""
    for outcome in outcomes:
        if outcome.reason == "UnknownDataSourceError":
            raise UnknownDataSourceError(outcome.message)
    return collect_outcomes(outcomes, data_sources, max_examples)
