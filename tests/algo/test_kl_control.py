"""Checks the KL controllers (fixed, adaptive; state round trips) and the in-reward KL penalty: hand
values, a plain loop, padding invariance, all-masked rows and an empty batch."""

import math

import pytest
import torch

from stratarl.algo.kl_control import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    make_kl_controller,
)


def test_fixed_controller_never_moves_and_round_trips():
    controller = FixedKLController(kl_coef=0.05)
    controller.update(current_kl=10.0, n_steps=1000)
    assert controller.value == 0.05
    restored = FixedKLController(kl_coef=0.9)
    restored.load_state_dict(controller.state_dict())
    assert restored.value == 0.05


def test_adaptive_controller_hand_computed():
    controller = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.1, horizon=100)
    # KL 0.15: e = clip(0.15/0.1 − 1 = 0.5, ±0.2) = 0.2; β = 0.1·(1 + 0.2·10/100) = 0.102
    controller.update(current_kl=0.15, n_steps=10)
    assert controller.value == pytest.approx(0.102, rel=1e-12)
    # KL 0.09: e = −0.1; β = 0.102·(1 − 0.1·10/100) = 0.102·0.99 = 0.10098
    controller.update(current_kl=0.09, n_steps=10)
    assert controller.value == pytest.approx(0.10098, rel=1e-12)
    # KL 0: e = clip(−1, ±0.2) = −0.2; β = 0.10098·(1 − 0.2·50/100) = 0.10098·0.9 = 0.090882
    controller.update(current_kl=0.0, n_steps=50)
    assert controller.value == pytest.approx(0.090882, rel=1e-12)


def test_adaptive_controller_state_round_trip_continues_identically():
    original = AdaptiveKLController(init_kl_coef=0.2, target_kl=0.05, horizon=1000)
    original.update(current_kl=0.3, n_steps=64)
    restored = AdaptiveKLController(init_kl_coef=1.0, target_kl=1.0, horizon=1)
    restored.load_state_dict(original.state_dict())
    for kl in (0.01, 0.07, 0.2):
        original.update(kl, 64)
        restored.update(kl, 64)
        assert restored.value == original.value


def test_make_kl_controller_kinds_and_errors():
    assert isinstance(make_kl_controller(), FixedKLController)
    assert make_kl_controller().value == 0.001  # verl's algorithm.kl_ctrl.kl_coef default
    adaptive = make_kl_controller("adaptive", kl_coef=0.3, target_kl=0.2, horizon=50)
    assert (adaptive.value, adaptive.target, adaptive.horizon) == (0.3, 0.2, 50)
    with pytest.raises(ValueError, match="horizon"):
        make_kl_controller("adaptive", horizon=0)
    with pytest.raises(ValueError, match="'adaptive'"):
        make_kl_controller("adaptiv")


SCORES = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
OLD = torch.tensor([[-1.0, -1.0, -1.0], [-0.5, -0.5, -0.5]])
REF = torch.tensor([[-1.5, -1.0, -2.0], [-1.0, -0.5, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def test_apply_kl_penalty_hand_computed():
    rewards, metrics = apply_kl_penalty(SCORES, OLD, REF, MASK, beta=0.1, kind="kl")
    # kl = old − ref = [[0.5, 0, 1], [0.5, 0, −0.5 → masked to 0]]
    # r = s − 0.1·kl = [[−0.05, 0, 1 − 0.1], [−0.05, 2, 0]]
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, 0.0, 0.9], [-0.05, 2.0, 0.0]]))
    # per-row means: (0.5 + 0 + 1)/3 = 0.5 and (0.5 + 0)/2 = 0.25; batch mean 0.375
    assert metrics["reward_kl_penalty"] == pytest.approx(0.375, rel=1e-6)
    assert metrics["reward_kl_penalty_coeff"] == 0.1


def test_apply_kl_penalty_matches_plain_loop():
    gen = torch.Generator().manual_seed(0)
    n, t = 5, 6
    scores = torch.randn(n, t, generator=gen, dtype=torch.float64)
    old = torch.randn(n, t, generator=gen, dtype=torch.float64)
    ref = torch.randn(n, t, generator=gen, dtype=torch.float64)
    mask = (torch.rand(n, t, generator=gen) > 0.3).to(torch.float64)  # fp64 so that + 1e-8 survives
    rewards, metrics = apply_kl_penalty(scores, old, ref, mask, beta=0.2, kind="low_var_kl")
    row_means = []
    for i in range(n):
        total, count = 0.0, 0
        for j in range(t):
            neg_delta = min(max(ref[i, j].item() - old[i, j].item(), -20.0), 20.0)
            kl = min(math.exp(neg_delta) - neg_delta - 1.0, 10.0) if mask[i, j] else 0.0
            assert rewards[i, j].item() == pytest.approx(scores[i, j].item() - 0.2 * kl, abs=1e-12)
            total, count = total + kl, count + int(mask[i, j])
        row_means.append(total / (count + 1e-8))
    assert metrics["reward_kl_penalty"] == pytest.approx(sum(row_means) / n, rel=1e-12)


def test_padding_garbage_changes_nothing():
    pad = torch.full((2, 4), float("nan"))
    rewards, metrics = apply_kl_penalty(
        torch.cat([SCORES, torch.zeros(2, 4)], dim=1),
        torch.cat([OLD, pad], dim=1),
        torch.cat([REF, pad], dim=1),
        torch.cat([MASK, torch.zeros(2, 4, dtype=torch.long)], dim=1),
        beta=0.1,
        kind="k3+",
    )
    base_rewards, base_metrics = apply_kl_penalty(SCORES, OLD, REF, MASK, beta=0.1, kind="k3+")
    torch.testing.assert_close(rewards[:, :3], base_rewards)
    assert torch.equal(rewards[:, 3:], torch.zeros(2, 4))
    assert metrics == base_metrics


def test_all_masked_row_counts_as_zero_kl_and_keeps_its_scores():
    mask = torch.tensor([[1, 1, 1], [0, 0, 0]])
    rewards, metrics = apply_kl_penalty(SCORES, OLD, REF, mask, beta=0.1, kind="kl")
    torch.testing.assert_close(rewards[1], SCORES[1])
    # verl's current_kl is a mean over every row: (0.5 + 0)/2
    assert metrics["reward_kl_penalty"] == pytest.approx(0.25, rel=1e-6)


def test_empty_batch_and_shape_errors():
    empty = torch.zeros(0, 3)
    rewards, metrics = apply_kl_penalty(empty, empty, empty, empty.long(), beta=0.1)
    assert rewards.shape == (0, 3) and metrics["reward_kl_penalty"] == 0.0
    with pytest.raises(ValueError, match="response_mask"):
        apply_kl_penalty(SCORES, OLD, REF, MASK[:, :2], beta=0.1)


def test_controller_closes_the_loop_with_the_penalty_metric():
    controller = make_kl_controller("adaptive", kl_coef=0.1, target_kl=0.1, horizon=10)
    _, metrics = apply_kl_penalty(SCORES, OLD, REF, MASK, beta=controller.value, kind="kl")
    controller.update(metrics["reward_kl_penalty"], n_steps=SCORES.shape[0])
    # KL 0.375 > target: e = 0.2; β = 0.1·(1 + 0.2·2/10) = 0.104
    assert controller.value == pytest.approx(0.104, rel=1e-6)
