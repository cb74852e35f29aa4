"""Checks GAE: a hand-computed multi-turn case, a plain per-token loop, invariances and degenerate masks."""

import pytest
import torch

from stratarl.algo.advantages.gae import gae_advantages


def _gae_loop(rewards, values, mask, gamma, lam):
    """Plain Python GAE: skip mask-0 tokens, then whiten over all action tokens (unbiased var)."""
    n, t_len = len(rewards), len(rewards[0])
    raw = [[0.0] * t_len for _ in range(n)]
    for i in range(n):
        next_value, next_adv = 0.0, 0.0
        for t in reversed(range(t_len)):
            if mask[i][t]:
                delta = rewards[i][t] + gamma * next_value - values[i][t]
                next_adv = delta + gamma * lam * next_adv
                next_value = values[i][t]
            raw[i][t] = next_adv
    picked = [raw[i][t] for i in range(n) for t in range(t_len) if mask[i][t]]
    mean = sum(picked) / len(picked)
    var = sum((x - mean) ** 2 for x in picked) / (len(picked) - 1)
    whitened = [[(raw[i][t] - mean) / (var + 1e-8) ** 0.5 for t in range(t_len)] for i in range(n)]
    returns = [[raw[i][t] + values[i][t] for t in range(t_len)] for i in range(n)]
    return torch.tensor(whitened, dtype=torch.float64), torch.tensor(returns, dtype=torch.float64)


def test_gae_hand_computed_with_an_observation_gap():
    # γ = 0.5, λ = 1. Row A, all actions, V = [0.2, 0.4, 0.6], reward 1 at the end:
    #   t=2: δ = 1 − 0.6 = 0.4,            Â = 0.4
    #   t=1: δ = 0.5·0.6 − 0.4 = −0.1,     Â = −0.1 + 0.5·0.4 = 0.1
    #   t=0: δ = 0.5·0.4 − 0.2 = 0,        Â = 0 + 0.5·0.1 = 0.05      returns = Â + V = [0.25, 0.5, 1]
    # Row B, mask [1, 0, 1] (token 1 is a tool result, its V = 9 is ignored):
    #   t=2: Â = 0.4;  t=1: passes Â = 0.4 through;  t=0: δ = 0.5·0.6 − 0.2 = 0.1, Â = 0.1 + 0.5·0.4 = 0.3
    #   returns = [0.5, 0.4 + 9, 1]
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[0.2, 0.4, 0.6], [0.2, 9.0, 0.6]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 1]])
    advantages, returns = gae_advantages(rewards, values, mask, gamma=0.5, lam=1.0)
    torch.testing.assert_close(
        returns, torch.tensor([[0.25, 0.5, 1.0], [0.5, 9.4, 1.0]], dtype=torch.float64), atol=1e-9, rtol=0
    )
    # Whitening over the 5 action tokens {0.05, 0.1, 0.4, 0.3, 0.4}: mean 0.25,
    # Σ(x−μ)² = 0.04 + 0.0225 + 0.0225 + 0.0025 + 0.0225 = 0.11, unbiased var = 0.11/4 = 0.0275.
    scale = (0.0275 + 1e-8) ** 0.5
    raw = torch.tensor([[0.05, 0.1, 0.4], [0.3, 0.4, 0.4]], dtype=torch.float64)
    torch.testing.assert_close(advantages, (raw - 0.25) / scale, atol=1e-6, rtol=0)


def test_gae_matches_a_plain_loop():
    gen = torch.Generator().manual_seed(1)
    rewards = torch.randn(5, 7, generator=gen, dtype=torch.float64)
    values = torch.randn(5, 7, generator=gen, dtype=torch.float64)
    mask = (torch.rand(5, 7, generator=gen) < 0.7).long()
    mask[3] = 0  # a fully masked row
    for gamma, lam in [(1.0, 1.0), (0.9, 0.95), (0.99, 0.0)]:
        advantages, returns = gae_advantages(rewards, values, mask, gamma=gamma, lam=lam)
        expected_adv, expected_ret = _gae_loop(rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam)
        torch.testing.assert_close(advantages, expected_adv, atol=1e-10, rtol=0)
        torch.testing.assert_close(returns, expected_ret, atol=1e-10, rtol=0)


def test_gae_ignores_right_padding_and_follows_row_permutations():
    gen = torch.Generator().manual_seed(2)
    rewards, values = torch.randn(4, 5, generator=gen), torch.randn(4, 5, generator=gen)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 1, 1, 0], [1, 1, 0, 0, 0]])
    advantages, returns = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.8)
    # Three padding columns full of garbage rewards and values, masked out.
    padded = gae_advantages(
        torch.cat([rewards, 5 * torch.randn(4, 3, generator=gen)], dim=1),
        torch.cat([values, 5 * torch.randn(4, 3, generator=gen)], dim=1),
        torch.cat([mask, torch.zeros(4, 3, dtype=mask.dtype)], dim=1),
        gamma=0.9,
        lam=0.8,
    )
    torch.testing.assert_close(padded[0][:, :5], advantages)
    torch.testing.assert_close(padded[1][:, :5], returns)
    order = torch.tensor([2, 0, 3, 1])
    permuted = gae_advantages(rewards[order], values[order], mask[order], gamma=0.9, lam=0.8)
    torch.testing.assert_close(permuted[0], advantages[order])
    torch.testing.assert_close(permuted[1], returns[order])


def test_gae_action_tokens_do_not_see_observation_tokens():
    # Removing a tool-result span leaves the advantages and returns of the action tokens unchanged.
    gen = torch.Generator().manual_seed(3)
    rewards, values = torch.randn(2, 6, generator=gen), torch.randn(2, 6, generator=gen)
    mask = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 0, 0, 1, 1, 1]])
    advantages, returns = gae_advantages(rewards, values, mask, gamma=0.95, lam=0.9)
    keep = mask.bool()
    compact = [rewards[keep].reshape(2, 4), values[keep].reshape(2, 4), torch.ones(2, 4)]
    compact_adv, compact_ret = gae_advantages(*compact, gamma=0.95, lam=0.9)
    torch.testing.assert_close(advantages[keep].reshape(2, 4), compact_adv)
    torch.testing.assert_close(returns[keep].reshape(2, 4), compact_ret)


def test_gae_fully_masked_row_and_too_few_tokens():
    rewards = torch.tensor([[0.0, 1.0], [3.0, 3.0]])
    values = torch.tensor([[0.5, 0.5], [0.7, 0.1]])
    mask = torch.tensor([[1, 1], [0, 0]])
    advantages, returns = gae_advantages(rewards, values, mask)
    # The empty row has Â = 0 everywhere, so its returns are its values; its advantages are the
    # whitened 0, not zeroed (as in verl: the loss masks them).
    assert returns[1].tolist() == pytest.approx([0.7, 0.1])
    # Row 0 (γ = λ = 1): Â_1 = 1 − 0.5 = 0.5, Â_0 = 0.5 − 0.5 + 0.5 = 0.5: equal, so σ = 0 and the
    # whitened value of any x is (x − 0.5)/√1e-8; the empty row holds (0 − 0.5)·1e4 = −5000.
    assert advantages[0].tolist() == pytest.approx([0.0, 0.0], abs=1e-6)
    assert advantages[1].tolist() == pytest.approx([-5000.0, -5000.0], rel=1e-5)
    with pytest.raises(ValueError, match="at least 2"):
        gae_advantages(rewards, values, torch.tensor([[1, 0], [0, 0]]))


def test_gae_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="values"):
        gae_advantages(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))
