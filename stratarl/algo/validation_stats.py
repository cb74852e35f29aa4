"""Layer 6, RL math: statistics of k sampled answers per validation prompt (verl's `metric_utils`
validation part): mean@N, std@N and bootstrap best@k / worst@k / maj@k, plus the unbiased pass@k.

Per data source, per prompt (uid) and per variable (`reward`, `acc`, ...), then averaged over prompts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy as np

DEFAULT_N_BOOTSTRAP = 1000  # verl's
DEFAULT_SEED = 42  # verl's


def bootstrap_metric(
    data: Sequence[Any],
    subset_size: int,
    reduce_fns: Sequence[Callable[[np.ndarray], float]],
    n_bootstrap: int = DEFAULT_N_BOOTSTRAP,
    seed: int = DEFAULT_SEED,
) -> list[tuple[float, float]]:
    """(mean, std) over `n_bootstrap` resamples of `subset_size` items drawn WITH replacement, per fn.

    Uses the same index stream as verl (`np.random.seed(seed)` then `np.random.choice`), from a private
    `RandomState`, so the global NumPy generator is left untouched.
    """
    values = np.array(data, dtype=object)
    indices = np.random.RandomState(seed).choice(len(values), size=(n_bootstrap, subset_size), replace=True)
    results = np.array([[fn(values[row]) for row in indices] for fn in reduce_fns], dtype=np.float64)
    return [(float(np.mean(row)), float(np.std(row))) for row in results]


def majority_value(data: Sequence[dict[str, Any]], vote_key: str = "pred", val_key: str = "val") -> Any:
    """The `val_key` of the first item voting for the most common `vote_key` (ties: first-seen vote).

    verl's `calc_maj_val`: maj@k scores the answer most samples agree on.
    """
    values_by_vote: dict[Hashable, list[Any]] = {}
    for item in data:
        values_by_vote.setdefault(item[vote_key], []).append(item[val_key])
    winner = max(values_by_vote, key=lambda vote: len(values_by_vote[vote]))
    return values_by_vote[winner][0]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021, arXiv:2107.03374): 1 − C(n−c, k)/C(n, k).

    The probability that k of the n samples, drawn WITHOUT replacement, contain at least one of the c
    correct ones. Computed stably as 1 − Π_{i=n−c+1}^{n} (1 − k/i). At k = n it is exactly 1[c > 0].

    verl's best@k (below) is different: it draws k samples WITH replacement and averages the max,
    so a prompt whose single correct sample is missed by a resample scores < 1 even at k = n; for a
    0/1 reward that is 1 − (1 − c/n)^k ≤ pass@k, i.e. biased low (verl PR #7240).
    """
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 ≤ c ≤ n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 ≤ k ≤ n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def subset_sizes(n: int) -> list[int]:
    """The k of best@k/worst@k/maj@k/pass@k: 2, 4, 8, … below n, then n (none for n ≤ 1)."""
    if n <= 1:
        return []
    return [*(2**e for e in range(1, math.ceil(math.log2(n)))), n]


def prompt_metrics(
    values: Sequence[float],
    preds: Sequence[Any] | None = None,
    *,
    n_bootstrap: int = DEFAULT_N_BOOTSTRAP,
    seed: int = DEFAULT_SEED,
) -> dict[str, float]:
    """The metrics of one prompt's n answers for one variable.

    mean@n, std@n (population); for each k of `subset_sizes(n)`: best@k/{mean,std},
    worst@k/{mean,std} (bootstrap of max/min), maj@k/{mean,std} when `preds` are given, and pass@k
    with "correct" meaning value > 0 (pass@k is our addition; verl 0.9 has only the bootstrap ones).
    """
    n = len(values)
    metrics = {f"mean@{n}": float(np.mean(values))}
    if n <= 1:
        return metrics
    metrics[f"std@{n}"] = float(np.std(values))
    num_correct = int(np.sum(np.asarray(values, dtype=np.float64) > 0))
    votes = [{"val": v, "pred": p} for v, p in zip(values, preds, strict=True)] if preds is not None else None
    for k in subset_sizes(n):
        (best_mean, best_std), (worst_mean, worst_std) = bootstrap_metric(
            values, k, [np.max, np.min], n_bootstrap=n_bootstrap, seed=seed
        )
        metrics.update({f"best@{k}/mean": best_mean, f"best@{k}/std": best_std})
        metrics.update({f"worst@{k}/mean": worst_mean, f"worst@{k}/std": worst_std})
        if votes is not None:
            [(maj_mean, maj_std)] = bootstrap_metric(
                votes, k, [majority_value], n_bootstrap=n_bootstrap, seed=seed
            )
            metrics.update({f"maj@{k}/mean": maj_mean, f"maj@{k}/std": maj_std})
        metrics[f"pass@{k}"] = pass_at_k(n, num_correct, k)
    return metrics


def process_validation_metrics(
    data_sources: Sequence[str],
    sample_uids: Sequence[Hashable],
    infos_dict: dict[str, Sequence[Any]],
    seed: int = DEFAULT_SEED,
    expected_acc_counts: Mapping[tuple[str, Hashable], int] | None = None,
    *,
    n_bootstrap: int = DEFAULT_N_BOOTSTRAP,
) -> dict[str, dict[str, dict[str, float]]]:
    """{data_source: {variable: {metric: value}}}: `prompt_metrics` per (source, uid, variable), then
    the plain mean over the uids of each source. None values (sessions that produced no score) are
    dropped; variables whose first remaining value is a str are skipped; a variable named "pred"
    supplies the votes of maj@k when it has one non-None vote per value.

    expected_acc_counts: {(source, uid): sessions started} (verl 0.9.1's v1 trainer passes it). For
    sources that report `acc`, missing sessions count as acc = 0 and `acc_success_only` keeps the
    statistics of the sessions that finished; a uid with no finished session gets acc = 0 only.
    """
    grouped: dict[str, dict[Hashable, dict[str, list[Any]]]] = {}
    for index, (source, uid) in enumerate(zip(data_sources, sample_uids, strict=True)):
        per_variable = grouped.setdefault(source, {}).setdefault(uid, {})
        for name, column in infos_dict.items():
            per_variable.setdefault(name, []).append(column[index])
    if expected_acc_counts:
        _count_missing_sessions_as_failures(grouped, expected_acc_counts)

    collected: dict[str, dict[str, dict[str, list[float]]]] = {}
    for source, by_uid in grouped.items():
        for per_variable in by_uid.values():
            preds = per_variable.get("pred")
            for name, raw_values in per_variable.items():
                values = [value for value in raw_values if value is not None]
                if not values or isinstance(values[0], str):
                    continue
                votes = preds if _usable_votes(preds, len(values)) else None
                metrics = prompt_metrics(values, votes, n_bootstrap=n_bootstrap, seed=seed)
                for metric, value in metrics.items():
                    collected.setdefault(source, {}).setdefault(name, {}).setdefault(metric, []).append(value)
    return {
        source: {
            name: {metric: float(np.mean(values)) for metric, values in by_metric.items()}
            for name, by_metric in by_name.items()
        }
        for source, by_name in collected.items()
    }


def _usable_votes(preds: list[Any] | None, num_values: int) -> bool:
    """maj@k needs one vote per value and no missing vote (verl's rule)."""
    return preds is not None and len(preds) == num_values and all(pred is not None for pred in preds)


def _count_missing_sessions_as_failures(
    grouped: dict[str, dict[Hashable, dict[str, list[Any]]]],
    expected_counts: Mapping[tuple[str, Hashable], int],
) -> None:
    """In place: `acc` padded with 0.0 up to the expected count and `acc_success_only` = the observed
    values, for the sources where some sample reports an `acc` (a reward-only source gains none)."""
    sources_with_acc = {
        source
        for source, by_uid in grouped.items()
        if any(value is not None for per_variable in by_uid.values() for value in per_variable.get("acc", []))
    }
    for (source, uid), expected in expected_counts.items():
        if source not in sources_with_acc:
            continue
        per_variable = grouped[source].setdefault(uid, {})
        observed = [value for value in per_variable.get("acc", []) if value is not None]
        per_variable["acc_success_only"] = observed
        per_variable["acc"] = observed + [0.0] * max(expected - len(observed), 0)
