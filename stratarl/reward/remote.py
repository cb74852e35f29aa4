"""Layer 5, rewards: a reward served over HTTP, called with a rate limit and retries.

`RemoteScorer` is a verl-signature `compute_score`: it POSTs
`{"data_source", "solution_str", "ground_truth", "extra_info"}` as JSON to `url` and reads back a
number or a dict with `score` (extra keys become metrics, as for any scorer). A token bucket keeps
the request rate at most `requests_per_second` (bursts up to `burst`) across all threads of the
process; a connection error, a timeout, HTTP 429 or 5xx is retried with exponential backoff
(honouring `Retry-After`), any other HTTP error fails at once. `score_batch` scores many samples
with `max_concurrency` threads. Each process has its own bucket: in a pool of K worker processes,
give each rate/K.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from stratarl.reward.batch_scorer import RewardResult, check_lengths, collect_outcomes
from stratarl.reward.score_call import call_scorer

RETRIED_STATUS = frozenset({429, 500, 502, 503, 504})


class TokenBucket:
    """At most `rate` acquisitions per second on average, `burst` at once; thread-safe, blocking."""

    def __init__(self, rate: float, burst: float = 1.0) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"rate must be > 0 and burst >= 1, got {rate}, {burst}")
        self.rate, self.burst = rate, burst
        self.tokens, self.updated = burst, time.monotonic()
        self.lock = threading.Lock()

    def acquire(self) -> None:
        while True:
            with self.lock:
                now = time.monotonic()
                self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
                self.updated = now
                if self.tokens >= 1:
                    self.tokens -= 1
                    return
                wait = (1 - self.tokens) / self.rate
            time.sleep(wait)


class RemoteScorer:
    """compute_score over HTTP; `attempts` counts every request sent (retries included)."""

    def __init__(
        self,
        url: str,
        *,
        requests_per_second: float = 10.0,
        burst: float = 1.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        timeout_s: float = 30.0,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.url, self.max_retries, self.backoff_s, self.timeout_s = url, max_retries, backoff_s, timeout_s
        self.requests_per_second, self.burst = requests_per_second, burst
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        self.bucket = TokenBucket(requests_per_second, burst)
        self.attempts = 0

    def __getstate__(self) -> dict[str, Any]:  # a bucket holds a lock: rebuilt in the new process
        return {k: v for k, v in self.__dict__.items() if k != "bucket"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.bucket = TokenBucket(self.requests_per_second, self.burst)

    def __call__(
        self, data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
    ) -> Any:
        body = {
            "data_source": data_source,
            "solution_str": solution_str,
            "ground_truth": ground_truth,
            "extra_info": extra_info,
        }
        return self._post(json.dumps(body, default=str).encode("utf-8"))

    def _post(self, payload: bytes) -> Any:
        for attempt in range(self.max_retries + 1):
            self.bucket.acquire()
            self.attempts += 1
            request = urllib.request.Request(self.url, data=payload, headers=self.headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    return json.loads(response.read().decode("utf-8"))
            except urllib.error.HTTPError as err:
                if err.code not in RETRIED_STATUS or attempt == self.max_retries:
                    raise
                delay = _retry_after(err) or self.backoff_s * 2**attempt
            except (urllib.error.URLError, TimeoutError, ConnectionError):
                if attempt == self.max_retries:
                    raise
                delay = self.backoff_s * 2**attempt
            time.sleep(min(delay, 60.0))
        raise AssertionError("unreachable")

    def score_batch(
        self,
        data_sources: Sequence[str],
        solution_strs: Sequence[str],
        ground_truths: Sequence[Any],
        extra_infos: Sequence[dict | None] | None = None,
        *,
        max_concurrency: int = 8,
    ) -> RewardResult:
        """Score N samples with up to `max_concurrency` requests in flight (rate-limited)."""
        infos = check_lengths(data_sources, solution_strs, ground_truths, extra_infos)
        jobs = list(zip(data_sources, solution_strs, ground_truths, infos, strict=True))
        with ThreadPoolExecutor(max_workers=max_concurrency) as pool:
            outcomes = list(pool.map(lambda job: call_scorer(self, *job), jobs))
        return collect_outcomes(outcomes, data_sources)


def _retry_after(err: urllib.error.HTTPError) -> float | None:
    value = err.headers.get("Retry-After") if err.headers else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
