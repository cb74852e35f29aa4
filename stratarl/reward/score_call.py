"""Layer 5, rewards: one call of a scoring function, made safe: an outcome, never an exception.

Shared by the in-process `score_batch` and the worker processes of `process_pool` (this module
imports neither torch nor numpy, so a worker starts fast). A scorer that raises — SystemExit
included — or returns something that is not a finite number (or a dict with one under `score`),
gives score 0 and a reason: the exception's class name, `bad_return` or `non_finite`. Only setup
errors — no scorer for the data source, no OS sandbox for code — and Ctrl-C are raised.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

from stratarl.observe.watchdog import WatchdogTimeout
from stratarl.reward.registry import UnknownDataSourceError
from stratarl.reward.sandbox_namespace import SandboxUnavailableError


@dataclass
class ScoreOutcome:
    """score (0 on failure), the scorer's extra dict entries, a failure reason or None, a message;
    from a worker process also what the call printed (bytes, and the first of them)."""

    score: float
    extras: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None
    message: str = ""
    output_bytes: int = 0
    output_head: str = ""


def call_scorer(
    compute_score: Callable[..., Any], data_source: str, solution_str: str, ground_truth: Any, extra_info: Any
) -> ScoreOutcome:
    """Call `compute_score(data_source, solution_str, ground_truth, extra_info)` (sync or async)."""
    try:
        result = compute_score(data_source, solution_str, ground_truth, extra_info)
        if inspect.isawaitable(result):  # an `async def` scorer (verl accepts those too)
            result = run_awaitable(result)
    except (UnknownDataSourceError, SandboxUnavailableError, KeyboardInterrupt, WatchdogTimeout):
        raise  # setup errors, and the user's or the watchdog's interrupt: the run's, not the sample's
    except BaseException as err:  # SystemExit too: a scorer must not end the run by raising
        message = f"exit code {err.code!r}" if isinstance(err, SystemExit) else str(err)[:200]
        return ScoreOutcome(0.0, {}, type(err).__name__, message)
    return normalize_result(result)


def normalize_result(result: Any) -> ScoreOutcome:
    """A float, or a dict with `score` and extras, as a `ScoreOutcome`."""
    extras: dict[str, Any] = {}
    if isinstance(result, dict):
        extras = {key: value for key, value in result.items() if key != "score"}
        if "score" not in result:
            return ScoreOutcome(0.0, extras, "bad_return", f"dict without 'score' (keys {sorted(result)})")
        result = result["score"]
    if not isinstance(result, Real) and callable(getattr(result, "item", None)):
        # numpy scalars and one-element tensors (np.bool_ is not a Real, its .item() is)
        size = result.numel() if callable(getattr(result, "numel", None)) else getattr(result, "size", 1)
        if size == 1:
            result = result.item()
    if not isinstance(result, Real):  # bool, int, float
        return ScoreOutcome(0.0, extras, "bad_return", f"score of type {type(result).__name__}")
    value = finite_float(result)
    if value is None:
        return ScoreOutcome(0.0, extras, "non_finite", f"score {str(result)[:50]}")
    return ScoreOutcome(value, extras)


def finite_float(value: Any) -> float | None:
    """`value` as a finite float, or None (NaN, ±inf, an int too large for a float, not a number)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        return float(value) if isinstance(value, bool) else None
    try:
        number = float(value)
    except (OverflowError, ValueError, TypeError):
        return None
    return number if math.isfinite(number) else None


def run_awaitable(awaitable: Any) -> Any:
    """Wait for an async scorer's result from sync code, also when this thread runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_awaited(awaitable))
    box: dict[str, Any] = {}

    def target() -> None:  # a running loop cannot be re-entered: wait in a thread of its own
        try:
            box["value"] = asyncio.run(_awaited(awaitable))
        except BaseException as err:  # re-raised in the caller's thread
            box["error"] = err

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


class ScorerCall:
    """The job handler of a scoring worker: (data_source, solution_str, ground_truth, extra_info) →
    `ScoreOutcome`; setup errors come back as outcomes too, named by their class."""

    def __init__(self, compute_score: Callable[..., Any]) -> None:
        self.compute_score = compute_score

    def __call__(self, job: tuple) -> ScoreOutcome:
        try:
            return call_scorer(self.compute_score, *job)
        except (UnknownDataSourceError, SandboxUnavailableError) as err:
            return ScoreOutcome(0.0, {}, type(err).__name__, str(err))


async def _awaited(awaitable: Any) -> Any:
    return await awaitable
