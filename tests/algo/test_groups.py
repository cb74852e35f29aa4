"""Checks group ids from uids and the per-group sum, count, mean and std against hand sums and loops."""

import numpy as np
import pytest
import torch

from stratarl.algo.groups import (
    check_group,
    group_count,
    group_ids_from_uids,
    group_max,
    group_mean,
    group_min,
    group_size,
    group_std,
    group_sum,
    num_groups,
)


def test_group_ids_number_uids_in_order_of_first_appearance():
    uids = np.array(["b", "a", "b", "c", "a"], dtype=object)
    ids = group_ids_from_uids(uids)
    assert ids.dtype == torch.int64
    assert ids.tolist() == [0, 1, 0, 2, 1]


def test_group_ids_treat_numbers_as_labels_and_match_numpy_scalars():
    assert group_ids_from_uids([7, 7, 3]).tolist() == [0, 0, 1]
    assert group_ids_from_uids(np.array([7, 3, 7])).tolist() == [0, 1, 0]
    assert group_ids_from_uids(torch.tensor([5, 5, 2])).tolist() == [0, 0, 1]
    assert group_ids_from_uids([]).tolist() == []


def test_group_sum_count_mean_by_hand():
    values = torch.tensor([1.0, 2.0, 4.0, 8.0, 16.0])
    group = torch.tensor([0, 1, 0, 2, 0])
    assert num_groups(group) == 3
    assert group_sum(values, group).tolist() == [21.0, 2.0, 8.0]  # 1+4+16, 2, 8
    assert group_count(group).tolist() == [3.0, 1.0, 1.0]
    assert group_size(group).tolist() == [3.0, 1.0, 3.0, 1.0, 3.0]
    assert group_mean(values, group).tolist() == [7.0, 2.0, 7.0, 8.0, 7.0]  # 21/3 = 7


def test_group_max_and_min_by_hand_with_an_unused_id():
    values = torch.tensor([3.0, -1.0, 5.0, 2.0])
    group = torch.tensor([0, 2, 0, 2])  # id 1 is unused
    assert group_max(values, group).tolist() == [5.0, -torch.inf, 2.0]
    assert group_min(values, group).tolist() == [3.0, torch.inf, -1.0]
    rows = torch.tensor([4, 1, 3, 0])
    assert group_min(rows, group).tolist() == [3, torch.iinfo(torch.int64).max, 0]


def test_group_sum_reduces_the_first_dim_of_token_tensors():
    values = torch.arange(6.0).reshape(3, 2)  # rows [0,1], [2,3], [4,5]
    assert group_sum(values, torch.tensor([1, 0, 1])).tolist() == [[2.0, 3.0], [4.0, 6.0]]


def test_group_std_is_bessel_corrected_and_zero_for_a_group_of_one():
    # group 0 = {1, 4, 16}: mean 7, squared deviations 36 + 9 + 81 = 126, /(3-1) = 63, std = √63
    values = torch.tensor([1.0, 2.0, 4.0, 16.0])
    group = torch.tensor([0, 1, 0, 0])
    std = group_std(values, group)
    assert std[0].item() == pytest.approx(63**0.5, abs=1e-6)
    assert std[1].item() == 0.0


def test_group_statistics_match_a_python_loop():
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(40, generator=gen, dtype=torch.float64)
    group = torch.randint(0, 7, (40,), generator=gen)
    mean, std = group_mean(values, group), group_std(values, group)
    for i in range(40):
        peers = values[group == group[i]]
        assert mean[i].item() == pytest.approx(peers.mean().item(), abs=1e-12)
        expected_std = peers.std().item() if len(peers) > 1 else 0.0
        assert std[i].item() == pytest.approx(expected_std, abs=1e-12)


def test_check_group_rejects_bad_shapes_and_dtypes():
    check_group(torch.tensor([0, 0, 1]), 3)
    with pytest.raises(ValueError, match="group"):
        check_group(torch.tensor([0, 1]), 3)
    with pytest.raises(ValueError, match="integer"):
        check_group(torch.tensor([0.0, 1.0, 1.0]), 3)
    with pytest.raises(ValueError, match="≥ 0"):
        check_group(torch.tensor([0, -1, 1]), 3)


def test_the_share_of_groups_with_signal_is_one_minus_all_right_minus_all_wrong():
    from stratarl.algo.groups import share_of_groups_with_signal

    assert share_of_groups_with_signal(0.0, 8) == 0.0 and share_of_groups_with_signal(1.0, 8) == 0.0
    assert share_of_groups_with_signal(0.5, 2) == pytest.approx(0.5)
    assert share_of_groups_with_signal(0.04, 8) == pytest.approx(1 - 0.04**8 - 0.96**8)
    # a Monte Carlo check of the formula: 20,000 groups of 8 Bernoulli(0.1) samples
    rng = torch.Generator().manual_seed(0)
    groups = torch.rand(20_000, 8, generator=rng) < 0.1
    varied = (groups.any(1) & ~groups.all(1)).float().mean().item()
    assert varied == pytest.approx(share_of_groups_with_signal(0.1, 8), abs=0.01)
