"""Checks validation statistics: unbiased pass@k against brute-force enumeration, verl's seeded bootstrap
(same index stream, global RNG untouched), majority voting, and the metric names and values of
process_validation_metrics."""

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from stratarl.algo.validation_stats import (
    bootstrap_metric,
    majority_value,
    pass_at_k,
    process_validation_metrics,
    prompt_metrics,
    subset_sizes,
)


def test_pass_at_k_hand_computed():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)  # c/n
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 − C(3,2)/C(5,2) = 1 − 3/10
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 − C(3,2)/C(4,2) = 1 − 3/6
    assert pass_at_k(4, 1, 4) == 1.0 and pass_at_k(4, 0, 4) == 0.0  # k = n: 1[c > 0]


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_equals_enumeration_of_all_k_subsets(n):
    for c in range(n + 1):
        correct = set(range(c))  # which samples are correct does not matter
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(range(n), k))
            hit = sum(1 for subset in subsets if correct.intersection(subset))
            assert pass_at_k(n, c, k) == pytest.approx(hit / len(subsets), abs=1e-12), (n, c, k)


def test_pass_at_k_is_stable_for_large_n():
    for n, c, k in [(1000, 1, 500), (1000, 3, 10), (2000, 1000, 64), (500, 0, 100)]:
        exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
        assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12, abs=1e-15)


def test_pass_at_k_rejects_bad_arguments():
    for n, c, k in [(4, 2, 5), (4, 2, 0), (4, 5, 2), (4, -1, 2)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def _verl_style_bootstrap(data, subset_size, reduce_fns, n_bootstrap, seed):
    """The algorithm as verl writes it: global seed, then np.random.choice, then one loop per fn."""
    np.random.seed(seed)
    values = np.array(data, dtype=object)
    idxs = np.random.choice(len(values), size=(n_bootstrap, subset_size), replace=True)
    out = []
    for fn in reduce_fns:
        results = [fn(values[idxs[b]]) for b in range(n_bootstrap)]
        out.append((float(np.mean(results)), float(np.std(results))))
    return out


def test_bootstrap_uses_verls_index_stream_without_touching_global_rng():
    data = [0.1, 0.9, 0.4, 0.0, 1.0, 0.3]
    state = np.random.get_state()
    got = bootstrap_metric(data, 4, [np.max, np.min, np.mean], n_bootstrap=200, seed=7)
    after = np.random.get_state()
    assert all(
        np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
        for a, b in zip(state, after, strict=True)
    )
    assert got == _verl_style_bootstrap(data, 4, [np.max, np.min, np.mean], 200, 7)


def test_best_at_k_is_biased_low_and_pass_at_k_is_not():
    # One correct answer of four: the prompt passed at k = 4, but a with-replacement resample of 4 misses
    # it with probability (3/4)^4 = 0.316, so best@4 ≈ 1 − 0.316 = 0.684.
    metrics = prompt_metrics([1.0, 0.0, 0.0, 0.0])
    assert metrics["pass@4"] == 1.0 and metrics["pass@2"] == pytest.approx(0.5)
    assert metrics["best@4/mean"] == pytest.approx(1 - 0.75**4, abs=0.05)
    assert metrics["best@2/mean"] == pytest.approx(1 - 0.75**2, abs=0.05) and metrics["best@2/mean"] < 0.5


def test_majority_value():
    votes = [{"pred": "A", "val": 0.9}, {"pred": "B", "val": 0.8}, {"pred": "A", "val": 0.7}]
    assert majority_value(votes) == 0.9  # A wins 2–1, its first value
    tie = [{"pred": "B", "val": 0.1}, {"pred": "A", "val": 0.2}]
    assert majority_value(tie) == 0.1  # a tie goes to the vote seen first


def test_subset_sizes():
    expected = {
        1: [],
        2: [2],
        3: [2, 3],
        4: [2, 4],
        5: [2, 4, 5],
        8: [2, 4, 8],
        9: [2, 4, 8, 9],
        16: [2, 4, 8, 16],
    }
    for n, ks in expected.items():
        assert subset_sizes(n) == ks


def test_process_validation_metrics_names_and_values():
    # prompt a: acc [1, 0, 0, 0]; prompt b: [1, 1, 1, 1]; prompt c (other source): [0, 1]
    sources = ["s1"] * 8 + ["s2"] * 2
    uids = ["a"] * 4 + ["b"] * 4 + ["c"] * 2
    acc = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0]
    preds = ["x", "y", "y", "z", "x", "x", "x", "x", "p", "q"]
    result = process_validation_metrics(sources, uids, {"acc": acc, "pred": preds, "note": ["t"] * 10})
    s1 = result["s1"]["acc"]
    assert set(result["s1"]) == {"acc"}  # str variables are skipped
    names = {"mean@4", "std@4"}
    for k in (2, 4):
        names |= {f"{m}@{k}/{s}" for m in ("best", "worst", "maj") for s in ("mean", "std")} | {f"pass@{k}"}
    assert set(s1) == names
    assert s1["mean@4"] == pytest.approx((0.25 + 1.0) / 2)
    assert s1["std@4"] == pytest.approx((math.sqrt(0.1875) + 0.0) / 2)  # population std of [1,0,0,0]
    assert s1["pass@2"] == pytest.approx((0.5 + 1.0) / 2) and s1["pass@4"] == 1.0
    # worst@4 of a is 1 only when all four draws hit the correct sample: (1/4)^4; of b always 1
    assert s1["worst@4/mean"] == pytest.approx((0.25**4 + 1.0) / 2, abs=0.01)
    assert s1["best@4/mean"] == pytest.approx((1 - 0.75**4 + 1.0) / 2, abs=0.03)
    # majority of a is "y" (value 0.0) whenever y leads the resample; of b always "x" (1.0)
    assert 0.5 <= s1["maj@4/mean"] < 1.0
    assert result["s2"]["acc"]["mean@2"] == 0.5 and result["s2"]["acc"]["pass@2"] == 1.0


def test_process_validation_metrics_matches_per_prompt_loop_and_seed():
    sources, uids, values = ["s"] * 6, ["u", "v", "u", "v", "u", "v"], [0.2, 1.0, 0.7, 0.0, 0.1, 0.5]
    result = process_validation_metrics(sources, uids, {"reward": values}, seed=3)["s"]["reward"]
    per_prompt = [prompt_metrics([0.2, 0.7, 0.1], seed=3), prompt_metrics([1.0, 0.0, 0.5], seed=3)]
    for name, value in result.items():
        assert value == pytest.approx((per_prompt[0][name] + per_prompt[1][name]) / 2, rel=1e-12)
    (best, _), (worst, _) = _verl_style_bootstrap([0.2, 0.7, 0.1], 2, [np.max, np.min], 1000, 3)
    assert per_prompt[0]["best@2/mean"] == best and per_prompt[0]["worst@2/mean"] == worst
    other_seed = process_validation_metrics(sources, uids, {"reward": values}, seed=4)["s"]["reward"]
    assert other_seed["best@2/mean"] != result["best@2/mean"]


def test_order_within_a_prompt_changes_no_exact_statistic():
    values = [0.0, 1.0, 0.0, 1.0, 1.0]
    shuffled = [1.0, 1.0, 0.0, 0.0, 1.0]
    a, b = prompt_metrics(values), prompt_metrics(shuffled)
    for name in ("mean@5", "std@5", "pass@2", "pass@4", "pass@5"):
        assert a[name] == b[name]


def test_group_of_one_gives_only_the_mean():
    result = process_validation_metrics(["s"], ["u"], {"acc": [1.0]})
    assert result == {"s": {"acc": {"mean@1": 1.0}}}


def test_none_values_are_dropped_and_votes_need_one_per_value():
    # uid u: acc [1, None, 0] -> [1, 0]: mean@2 = 0.5, std@2 = 0.5. Three votes for two values: no maj@k.
    result = process_validation_metrics(
        ["s"] * 3, ["u"] * 3, {"acc": [1.0, None, 0.0], "pred": ["a", "b", "a"]}
    )
    acc = result["s"]["acc"]
    assert acc["mean@2"] == 0.5 and acc["std@2"] == 0.5
    assert not any(name.startswith("maj@") for name in acc)
    # a missing vote also disables maj@k; every value None drops the variable
    result = process_validation_metrics(
        ["s"] * 2, ["u"] * 2, {"acc": [1.0, 0.0], "pred": ["a", None], "r": [None] * 2}
    )
    assert not any(name.startswith("maj@") for name in result["s"]["acc"]) and "r" not in result["s"]


def test_expected_counts_turn_missing_sessions_into_failures():
    # s: uid u finished 2 of 4 sessions (acc 1, 1) -> acc [1, 1, 0, 0]: mean@4 = 0.5; acc_success_only
    # mean@2 = 1. uid v finished none of 2 -> acc [0, 0]: mean@2 = 0, and no acc_success_only.
    # r reports no acc: its expected count changes nothing.
    sources, uids = ["s", "s", "r"], ["u", "u", "w"]
    infos = {"acc": [1.0, 1.0, None], "reward": [0.5, 0.7, 0.2]}
    expected = {("s", "u"): 4, ("s", "v"): 2, ("r", "w"): 3}
    result = process_validation_metrics(sources, uids, infos, expected_acc_counts=expected)
    assert result["s"]["acc"]["mean@4"] == 0.5 and result["s"]["acc"]["mean@2"] == 0.0
    assert result["s"]["acc_success_only"]["mean@2"] == 1.0
    assert set(result["r"]) == {"reward"} and result["r"]["reward"] == {"mean@1": 0.2}
    assert result["s"]["reward"]["mean@2"] == pytest.approx(0.6)
