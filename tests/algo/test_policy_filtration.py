"""PF-PPO's weights by hand, its draws against a plain loop and their seeded reproducibility, and
degenerate batches (all-equal scores, one row, bad input)."""

import math

import pytest
import torch

from stratarl.algo.policy_filtration import PF_PPO_WEIGHTS, pf_ppo_resample, pf_ppo_weights

SCORES = torch.tensor([1.0, 0.0, -2.0, 0.5, 1.0], dtype=torch.float64)
FLOOR = 1e-8


def test_pow_weights_by_hand():
    # |R|^2: 1, 0, 4, 0.25, 1; then + 1e-8 (a score of 0 keeps weight 1e-8)
    weights = pf_ppo_weights(scores=SCORES, reweight_method="pow", weight_pow=2.0)
    expected = torch.tensor([1.0, 0.0, 4.0, 0.25, 1.0], dtype=torch.float64) + FLOOR
    torch.testing.assert_close(weights, expected, rtol=0, atol=1e-15)
    # p = 1: |R| = 1, 0, 2, 0.5, 1
    weights = pf_ppo_weights(scores=SCORES, reweight_method="pow", weight_pow=1.0)
    torch.testing.assert_close(weights, SCORES.abs() + FLOOR, rtol=0, atol=1e-15)


def test_max_min_keeps_every_row_at_the_batch_max_or_min():
    # max R = 1 (rows 0 and 4, a tie), min R = -2 (row 2): weights 1, the others 0 (+ 1e-8)
    weights = pf_ppo_weights(scores=SCORES, reweight_method="max_min")
    assert weights.tolist() == pytest.approx([1.0, FLOOR, 1.0, FLOOR, 1.0], rel=1e-6)


def test_max_random_weighs_the_max_four_times_the_others():
    # rows 0 and 4 hold the max: 0.4; the others 0.1
    weights = pf_ppo_weights(scores=SCORES, reweight_method="max_random")
    assert weights.tolist() == pytest.approx([0.4, 0.1, 0.1, 0.1, 0.4], rel=1e-6)


@pytest.mark.parametrize("method", sorted(PF_PPO_WEIGHTS))
def test_draws_are_n_row_indices_and_the_same_seed_gives_the_same_rows(method):
    draw = lambda seed: pf_ppo_resample(  # noqa: E731
        scores=SCORES, reweight_method=method, generator=torch.Generator().manual_seed(seed)
    )
    rows = draw(3)
    assert rows.shape == (5,) and rows.dtype == torch.int64
    assert int(rows.min()) >= 0 and int(rows.max()) < 5
    assert torch.equal(rows, draw(3))
    assert any(not torch.equal(rows, draw(seed)) for seed in range(4, 12))


def plain_weights(scores: list[float], method: str, p: float) -> list[float]:
    """The weights one row at a time, from the equations in the docstring."""
    hi, lo = max(scores), min(scores)
    out = []
    for r in scores:
        if method == "pow":
            w = abs(r) ** p
        elif method == "max_min":
            w = 1.0 if r in (hi, lo) else 0.0
        else:
            w = 0.4 if r == hi else 0.1
        out.append(max(w + 1e-8, 1e-8))
    return out


@pytest.mark.parametrize("method", sorted(PF_PPO_WEIGHTS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_weights_match_a_plain_loop(method, seed):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randint(-2, 3, (12,), generator=gen).double() * 0.5  # ties at max and min
    scores[3] += 0.25
    weights = pf_ppo_weights(scores=scores, reweight_method=method, weight_pow=1.5)
    expected = plain_weights(scores.tolist(), method, 1.5)
    assert weights.tolist() == pytest.approx(expected, rel=1e-6, abs=0)


def test_draw_frequencies_follow_the_weights():
    # max_random on 5 rows: p = 0.4/1.1 for rows 0 and 4, 0.1/1.1 for the other three
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(5)
    for _ in range(400):
        rows = pf_ppo_resample(scores=SCORES, reweight_method="max_random", generator=gen)
        counts += torch.bincount(rows, minlength=5)
    share = counts / counts.sum()  # 2,000 draws: std of a share ≈ sqrt(p(1-p)/2000) ≤ 0.011
    expected = torch.tensor([0.4, 0.1, 0.1, 0.1, 0.4]) / 1.1
    assert (share - expected).abs().max() < 0.05


def test_max_min_never_draws_a_middle_row_in_practice():
    # middle rows have weight 1e-8 against 3: a draw lands there with probability ≈ 3.3e-9
    gen = torch.Generator().manual_seed(1)
    for _ in range(50):
        rows = pf_ppo_resample(scores=SCORES, reweight_method="max_min", generator=gen)
        assert set(rows.tolist()) <= {0, 2, 4}


@pytest.mark.parametrize("method", sorted(PF_PPO_WEIGHTS))
@pytest.mark.parametrize("value", [0.0, 1.0, -0.5])
def test_all_equal_scores_give_equal_weights(method, value):
    # every row is max and min at once (max_min: 1; max_random: 0.4); pow: |v|^2, 0 -> 1e-8 for all
    weights = pf_ppo_weights(scores=torch.full((6,), value), reweight_method=method)
    assert torch.all(weights == weights[0]) and float(weights[0]) > 0


@pytest.mark.parametrize("method", sorted(PF_PPO_WEIGHTS))
def test_a_batch_of_one_draws_its_only_row(method):
    rows = pf_ppo_resample(scores=torch.tensor([0.3]), reweight_method=method)
    assert rows.tolist() == [0]


def test_weight_pow_zero_is_uniform():
    # |R|^0 = 1 for every row, 0^0 included
    weights = pf_ppo_weights(scores=SCORES, reweight_method="pow", weight_pow=0.0)
    assert torch.all(weights == 1.0 + FLOOR)


def test_inputs_are_not_modified():
    scores = SCORES.clone()
    pf_ppo_resample(scores=scores, reweight_method="pow", generator=torch.Generator().manual_seed(0))
    assert torch.equal(scores, SCORES)


def test_bad_input_is_refused_naming_the_problem():
    with pytest.raises(ValueError, match=r"unknown PF-PPO reweight method 'maxmin'.*'max_min'"):
        pf_ppo_weights(scores=SCORES, reweight_method="maxmin")
    with pytest.raises(ValueError, match=r"shape \[N ≥ 1\]"):
        pf_ppo_resample(scores=torch.zeros(0))
    with pytest.raises(ValueError, match=r"shape \[N ≥ 1\]"):
        pf_ppo_resample(scores=torch.zeros(2, 3))
    with pytest.raises(ValueError, match="finite"):
        pf_ppo_resample(scores=torch.tensor([1.0, math.nan]))
    with pytest.raises(ValueError, match="not finite"):  # 0^-1 = inf
        pf_ppo_resample(scores=torch.tensor([1.0, 0.0]), reweight_method="pow", weight_pow=-1.0)


def test_the_registry_holds_verls_three_methods():
    assert list(PF_PPO_WEIGHTS) == ["pow", "max_min", "max_random"]
