"""Layer 5, training engine: splitting rows into balanced groups — micro-batches and data-parallel shares.

Two uses of one algorithm, the largest differencing method of Karmarkar & Karp ("The differencing
method of set partitioning", 1982), applied to a workload estimate per row:

* `micro_batches_by_tokens`: the fewest micro-batches whose token sums stay within a budget
  (verl's `use_dynamic_bsz` / `ppo_max_token_len_per_gpu`), balanced by workload;
* `balance_for_ranks`: equal-count shares of a step's rows, one per data-parallel rank, balanced by
  workload (verl's `_balance_batch`).

The workload of a row of s tokens is a FLOP proxy, a·s + s² (the linear layers cost ∝ s, attention
∝ s²; a = 12·hidden_size gives their ratio for a standard decoder, verl fixes a = 24576).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence


def workload(seq_len: int, linear_coeff: float) -> float:
    """a·s + s²: relative forward cost of one row of s tokens (a = 12·hidden_size for a decoder)."""
    return linear_coeff * seq_len + seq_len * seq_len


def karmarkar_karp(weights: Sequence[float], k: int, *, equal_size: bool = False) -> list[list[int]]:
    """k groups of row indices whose weight sums are close (largest differencing method).

    Each partial solution holds k subsets; its spread is max sum − min sum. The two partial solutions
    of largest spread are merged, pairing the heaviest subset of one with the lightest of the other,
    until one remains. With equal_size (len(weights) % k == 0) the starting solutions are k rows of
    consecutive weight, one per subset, so every subset ends with len/k rows. Groups are returned
    sorted by their smallest index, each in increasing index order; empty groups are kept.
    """
    n = len(weights)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if equal_size and n % k:
        raise ValueError(f"equal_size needs the row count ({n}) divisible by k ({k})")
    order = sorted(range(n), key=lambda i: (weights[i], i))
    starts = [order[lo : lo + k] for lo in range(0, n, k)] if equal_size else [[i] for i in order]
    counter = itertools.count()
    heap = []
    for rows in starts:
        subsets = [(float(weights[i]), [i]) for i in rows] + [(0.0, []) for _ in range(k - len(rows))]
        heapq.heappush(heap, _heap_entry(subsets, next(counter)))
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        heaviest_first = sorted(a, key=lambda s: -s[0])
        lightest_first = sorted(b, key=lambda s: s[0])
        merged = [(x[0] + y[0], x[1] + y[1]) for x, y in zip(heaviest_first, lightest_first, strict=True)]
        heapq.heappush(heap, _heap_entry(merged, next(counter)))
    subsets = heap[0][2] if heap else [(0.0, []) for _ in range(k)]
    return sorted((sorted(rows) for _, rows in subsets), key=lambda rows: rows[0] if rows else math.inf)


def _heap_entry(subsets: list[tuple[float, list[int]]], tie: int) -> tuple[float, int, list]:
    sums = [s for s, _ in subsets]
    return (-(max(sums) - min(sums)), tie, subsets)  # heapq pops the largest spread first


def micro_batches_by_tokens(
    seq_lens: Sequence[int], max_tokens: int, *, linear_coeff: float = 0.0
) -> list[list[int]]:
    """The fewest non-empty groups (from ⌈Σs / budget⌉ up) whose token sums are ≤ `max_tokens`,
    balanced by workload. Raises when a single row is longer than the budget."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if not seq_lens:
        return []
    longest = max(seq_lens)
    if longest > max_tokens:
        raise ValueError(
            f"a row of {longest} tokens exceeds max_tokens_per_micro_batch={max_tokens}; raise the budget"
        )
    loads = [workload(s, linear_coeff) for s in seq_lens]
    for k in range(math.ceil(sum(seq_lens) / max_tokens), len(seq_lens) + 1):
        groups = [g for g in karmarkar_karp(loads, k) if g]
        if all(sum(seq_lens[i] for i in g) <= max_tokens for g in groups):
            return groups
    raise AssertionError("unreachable: k = number of rows gives one row per group")


def split_to_count(groups: list[list[int]], weights: Sequence[float], count: int) -> list[list[int]]:
    """`groups` split further until there are `count` of them (data-parallel ranks must run the same
    number of micro-batches). The heaviest group with ≥ 2 rows is halved by workload; when every group
    is a single row, empty groups are appended (the engine runs them as zero-weight passes)."""
    if count < len(groups):
        raise ValueError(f"cannot reduce {len(groups)} groups to {count}")
    groups = [list(g) for g in groups]
    while len(groups) < count:
        splittable = [g for g in groups if len(g) >= 2]
        if not splittable:
            groups.append([])
            continue
        heaviest = max(splittable, key=lambda g: sum(weights[i] for i in g))
        groups.remove(heaviest)
        halves = karmarkar_karp([weights[i] for i in heaviest], 2)
        groups.extend([heaviest[j] for j in half] for half in halves)
    return groups


def balance_for_ranks(seq_lens: Sequence[int], dp_size: int, *, linear_coeff: float = 0.0) -> list[list[int]]:
    """dp_size equal-count groups of row indices, balanced by workload; group r goes to rank r."""
    loads = [workload(s, linear_coeff) for s in seq_lens]
    return karmarkar_karp(loads, dp_size, equal_size=True)


def rank_balanced_order(seq_lens: Sequence[int], dp_size: int, *, linear_coeff: float = 0.0) -> list[int]:
    """A permutation for `DataProto.reorder` after which `chunk(dp_size)` hands each rank a balanced
    share (the groups of `balance_for_ranks`, concatenated)."""
    return [i for group in balance_for_ranks(seq_lens, dp_size, linear_coeff=linear_coeff) for i in group]


def balance_metrics(
    seq_lens: Sequence[int], groups: Sequence[Sequence[int]], prefix: str
) -> dict[str, float]:
    """verl's `global_seqlen/*` metrics: token sums per group before (consecutive equal chunks) and
    after balancing. `minmax_diff` is before; `balanced_min/max` after."""
    k = len(groups)
    n = len(seq_lens)
    bounds = [round(j * n / k) for j in range(k + 1)]
    before = [sum(seq_lens[lo:hi]) for lo, hi in itertools.pairwise(bounds)]
    after = [sum(seq_lens[i] for i in g) for g in groups]
    return {
        f"{prefix}/min": float(min(before)),
        f"{prefix}/max": float(max(before)),
        f"{prefix}/minmax_diff": float(max(before) - min(before)),
        f"{prefix}/balanced_min": float(min(after)),
        f"{prefix}/balanced_max": float(max(after)),
        f"{prefix}/mean": sum(seq_lens) / k,
    }
