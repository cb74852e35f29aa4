"""Karmarkar–Karp partitions, token-budget micro-batches, rank balancing, and the restored row order."""

import itertools
import random

import pytest
import torch

from stratarl.engine.actor import compute_log_probs
from stratarl.engine.partition import (
    balance_for_ranks,
    balance_metrics,
    karmarkar_karp,
    micro_batches_by_tokens,
    rank_balanced_order,
    split_to_count,
    workload,
)
from tests.engine.tiny_batches import ragged_batch, tiny_model


def sums(groups, weights):
    return [sum(weights[i] for i in g) for g in groups]


def is_partition(groups, n):
    flat = sorted(i for g in groups for i in g)
    return flat == list(range(n))


def test_two_way_differencing_on_the_textbook_example():
    # {8,7,6,5,4}: differences 8−7=1, 6−5=1, then 4−1=3, 3−1=2 → the method ends at a gap of 2
    # ({8,6}=14 vs {7,5,4}=16), where the optimum is 0 ({8,7} vs {6,5,4}); KK is a heuristic.
    groups = karmarkar_karp([8, 7, 6, 5, 4], 2)
    assert is_partition(groups, 5) and sorted(sums(groups, [8, 7, 6, 5, 4])) == [14, 16]


def test_equal_size_groups_have_equal_counts_and_are_balanced():
    rng = random.Random(0)
    for n, k in [(6, 2), (12, 3), (16, 4), (9, 9)]:
        weights = [rng.randint(1, 100) for _ in range(n)]
        groups = karmarkar_karp(weights, k, equal_size=True)
        assert is_partition(groups, n) and all(len(g) == n // k for g in groups)
        # no worse than cutting the sorted list into consecutive blocks of equal count
        ordered = sorted(range(n), key=lambda i: weights[i])
        blocks = [ordered[j : j + n // k] for j in range(0, n, n // k)]
        spread = max(sums(groups, weights)) - min(sums(groups, weights))
        assert spread <= max(sums(blocks, weights)) - min(sums(blocks, weights))
    with pytest.raises(ValueError, match="divisible"):
        karmarkar_karp([1, 2, 3], 2, equal_size=True)


def test_kk_matches_brute_force_optimum_often_and_never_far_from_it():
    rng = random.Random(1)
    for _ in range(30):
        weights = [rng.randint(1, 50) for _ in range(7)]
        best = min(
            max(sums(split, weights)) - min(sums(split, weights))
            for labels in itertools.product(range(2), repeat=7)
            for split in [[[i for i in range(7) if labels[i] == j] for j in range(2)]]
        )
        got = karmarkar_karp(weights, 2)
        gap = max(sums(got, weights)) - min(sums(got, weights))
        assert best <= gap <= max(weights)  # differencing never leaves more than the largest item


def test_token_budget_groups_fit_cover_every_row_and_are_few():
    rng = random.Random(2)
    seq_lens = [rng.randint(1, 40) for _ in range(50)]
    for budget in (40, 64, 100, 1000):
        groups = micro_batches_by_tokens(seq_lens, budget, linear_coeff=12 * 16)
        assert is_partition(groups, 50) and all(g for g in groups)
        assert all(t <= budget for t in sums(groups, seq_lens))
        assert len(groups) >= -(-sum(seq_lens) // budget)
    assert len(micro_batches_by_tokens(seq_lens, sum(seq_lens))) == 1
    with pytest.raises(ValueError, match="exceeds max_tokens_per_micro_batch"):
        micro_batches_by_tokens([5, 41], 40)


def test_split_to_count_keeps_the_budget_and_pads_with_empty_groups():
    seq_lens = [10, 9, 3, 2, 2]
    loads = [workload(s, 0.0) for s in seq_lens]
    groups = micro_batches_by_tokens(seq_lens, 20)
    more = split_to_count(groups, loads, 4)
    assert len(more) == 4 and is_partition(more, 5)
    assert all(t <= 20 for t in sums(more, seq_lens))
    seven = split_to_count(more, loads, 7)  # 5 rows: 5 singletons and 2 empty groups
    assert sorted(len(g) for g in seven) == [0, 0, 1, 1, 1, 1, 1] and is_partition(seven, 5)
    with pytest.raises(ValueError):
        split_to_count(more, loads, 2)


def test_rank_balancing_gives_equal_counts_and_a_permutation_for_chunk():
    seq_lens = [100, 3, 90, 4, 80, 5, 70, 6]  # consecutive halves: 197 vs 161 tokens
    groups = balance_for_ranks(seq_lens, 2)
    assert [len(g) for g in groups] == [4, 4] and is_partition(groups, 8)
    order = rank_balanced_order(seq_lens, 2)
    assert sorted(order) == list(range(8)) and [order[:4], order[4:]] == groups
    metrics = balance_metrics(seq_lens, groups, "global_seqlen")
    assert metrics["global_seqlen/max"] == 197 and metrics["global_seqlen/min"] == 161
    assert metrics["global_seqlen/minmax_diff"] == 36 and metrics["global_seqlen/mean"] == 179
    assert metrics["global_seqlen/balanced_max"] - metrics["global_seqlen/balanced_min"] < 36


def test_token_budget_scoring_restores_the_original_row_order():
    model, batch = tiny_model(), ragged_batch(n=12, seed=3)
    one_pass, _ = compute_log_probs(model, batch, micro_batch_size=12, temperature=1.0)
    lens = batch["attention_mask"].sum(1).tolist()
    assert len(micro_batches_by_tokens(lens, 12)) > 3  # the groups reorder rows
    regrouped, _ = compute_log_probs(
        model, batch, micro_batch_size=12, temperature=1.0, max_tokens_per_micro_batch=12
    )
    torch.testing.assert_close(regrouped, one_pass, atol=1e-6, rtol=1e-5)
