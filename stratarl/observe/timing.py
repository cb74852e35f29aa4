"""Cross-cutting: phase timers that feed `timing_s/<phase>` metrics (verl's names)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def timed(name: str, timings: dict[str, float]) -> Iterator[None]:
    """Add the wall time of the block to timings[name] (seconds), also when the block raises."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - start


def timing_metrics(timings: dict[str, float], num_response_tokens: int, num_tokens: int) -> dict[str, float]:
    """`timing_s/<phase>` and `timing_per_token_ms/<phase>` as verl reports them: generation per
    response token, the training-side phases per token of prompt + response."""
    metrics = {f"timing_s/{name}": seconds for name, seconds in timings.items()}
    per_response_token = {"gen"}
    per_token = {"ref", "values", "adv", "update_critic", "update_actor", "old_log_prob"}
    for name, seconds in timings.items():
        count = num_response_tokens if name in per_response_token else num_tokens if name in per_token else 0
        if count:
            metrics[f"timing_per_token_ms/{name}"] = 1000.0 * seconds / count
    return metrics
