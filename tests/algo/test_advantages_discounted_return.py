"""Checks REINFORCE++ and ReMax: hand-computed multi-turn returns, Python loops, invariances, edge cases."""

import statistics

import pytest
import torch

from stratarl.algo.advantages.discounted_return import (
    discounted_returns,
    reinforce_plus_plus_advantages,
    remax_advantages,
)


def _returns_loop(rewards, mask, gamma):
    """Per-row reverse scan: action tokens take r + γ·G_next, observation/padding tokens store 0."""
    out = []
    for row_r, row_m in zip(rewards, mask, strict=True):
        running, row = 0.0, [0.0] * len(row_r)
        for t in reversed(range(len(row_r))):
            if row_m[t]:
                running = row_r[t] + gamma * running
                row[t] = running
        out.append(row)
    return out


def _multi_turn_batch(seed, n=6, width=8):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(n, width, generator=gen, dtype=torch.float64)
    mask = (torch.rand(n, width, generator=gen) < 0.7).long()
    mask[:, 0] = 1
    return rewards, mask


def test_reinforce_plus_plus_hand_computed_across_a_tool_result():
    # γ = 0.5. Row 0 = [act, act, obs, obs, act, act], reward 1 at the end:
    #   G_5 = 1, G_4 = 0.5, the observations store 0 and pass 0.5 through undiscounted,
    #   G_1 = 0.5·0.5 = 0.25, G_0 = 0.125.
    # Row 1 = [act, act, act, pad, pad, pad], reward 2 on token 2: G = [0.5, 1, 2, 0, 0, 0].
    # Garbage rewards on observation/padding tokens (7, 9) never enter a return.
    rewards = torch.tensor([[0, 0, 7, 7, 0, 1], [0, 0, 2, 9, 9, 9]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 1, 1, 0, 0, 0]])
    advantages, returns = reinforce_plus_plus_advantages(rewards, mask, gamma=0.5)
    expected = torch.tensor([[0.125, 0.25, 0, 0, 0.5, 1], [0.5, 1, 2, 0, 0, 0]], dtype=torch.float64)
    torch.testing.assert_close(returns, expected, atol=1e-12, rtol=0)
    # Whitening over the 7 action returns {0.125, 0.25, 0.5, 1, 0.5, 1, 2}: Σ = 5.375, μ = 5.375/7.
    tokens = [0.125, 0.25, 0.5, 1.0, 0.5, 1.0, 2.0]
    mean, var = 5.375 / 7, statistics.variance(tokens)
    torch.testing.assert_close(advantages, (expected - mean) / (var + 1e-8) ** 0.5 * mask, atol=1e-9, rtol=0)


def test_reinforce_plus_plus_matches_a_python_loop():
    rewards, mask = _multi_turn_batch(0)
    mask[2] = 0  # a fully masked row
    for gamma in (1.0, 0.9):
        advantages, returns = reinforce_plus_plus_advantages(rewards, mask, gamma=gamma)
        expected = torch.tensor(_returns_loop(rewards.tolist(), mask.tolist(), gamma), dtype=torch.float64)
        torch.testing.assert_close(returns, expected, atol=1e-12, rtol=0)
        tokens = expected[mask.bool()].tolist()
        whitened = (expected - statistics.mean(tokens)) / (statistics.variance(tokens) + 1e-8) ** 0.5
        torch.testing.assert_close(advantages, whitened * mask, atol=1e-10, rtol=0)
        assert advantages[2].abs().max().item() == 0.0 and returns[2].abs().max().item() == 0.0


def test_reinforce_plus_plus_action_tokens_do_not_see_observation_tokens():
    # Squeezing out the observation tokens leaves every action token's return and advantage unchanged.
    rewards = torch.randn(2, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 0, 0, 1, 1, 1]])
    advantages, returns = reinforce_plus_plus_advantages(rewards, mask, gamma=0.9)
    keep = mask.bool()
    compact = reinforce_plus_plus_advantages(rewards[keep].reshape(2, 4), torch.ones(2, 4), gamma=0.9)
    torch.testing.assert_close(advantages[keep].reshape(2, 4), compact[0])
    torch.testing.assert_close(returns[keep].reshape(2, 4), compact[1])


def test_reinforce_plus_plus_padding_permutation_and_too_few_tokens():
    rewards, mask = _multi_turn_batch(2)
    advantages, returns = reinforce_plus_plus_advantages(rewards, mask, gamma=0.95)
    pad = torch.full((6, 3), 4.0, dtype=rewards.dtype)  # garbage rewards on padding
    padded = reinforce_plus_plus_advantages(
        torch.cat([rewards, pad], 1), torch.cat([mask, torch.zeros(6, 3, dtype=mask.dtype)], 1), gamma=0.95
    )
    torch.testing.assert_close(padded[0][:, :8], advantages)
    torch.testing.assert_close(padded[1][:, :8], returns)
    order = torch.tensor([5, 3, 0, 1, 4, 2])
    permuted = reinforce_plus_plus_advantages(rewards[order], mask[order], gamma=0.95)
    torch.testing.assert_close(permuted[0], advantages[order])
    with pytest.raises(ValueError, match="at least 2"):
        reinforce_plus_plus_advantages(rewards[:1], torch.eye(8, dtype=torch.long)[:1], gamma=0.95)


def test_discounted_returns_with_gamma_one_is_a_masked_reverse_cumsum_on_action_tokens():
    rewards, mask = _multi_turn_batch(3)
    kept = rewards * mask
    expected = kept.flip(-1).cumsum(-1).flip(-1) * mask
    torch.testing.assert_close(discounted_returns(rewards, mask, 1.0), expected)


def test_remax_hand_computed():
    # b = [0.4, 0.4, 0.4]. Row 0 all actions, r = [0, 0, 1]: G = [1, 1, 1], A = G − b = 0.6.
    # Row 1 mask [1, 0, 1], a reward 5 on the tool token is ignored: G = [1, 1, 1]; the observation
    #   keeps A = G = 1 (b·m = 0 there), as in verl.
    # Row 2 mask [1, 1, 0], r = [0, 2, 0]: G = [2, 2, 0], A = [1.6, 1.6, 0].
    rewards = torch.tensor([[0, 0, 1], [0, 5, 1], [0, 2, 0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 1], [1, 1, 0]])
    baselines = torch.tensor([0.4, 0.4, 0.4], dtype=torch.float64)
    advantages, returns = remax_advantages(rewards, mask, baselines)
    torch.testing.assert_close(returns, torch.tensor([[1, 1, 1], [1, 1, 1], [2, 2, 0]], dtype=torch.float64))
    expected = torch.tensor([[0.6, 0.6, 0.6], [0.6, 1.0, 0.6], [1.6, 1.6, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(advantages, expected, atol=1e-12, rtol=0)


def test_remax_matches_a_python_loop_and_follows_permutations():
    rewards, mask = _multi_turn_batch(4)
    baselines = torch.randn(6, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    advantages, returns = remax_advantages(rewards, mask, baselines)
    for i in range(6):
        for t in range(8):
            to_go = sum(rewards[i, s].item() for s in range(t, 8) if mask[i, s])
            assert returns[i, t].item() == pytest.approx(to_go, abs=1e-12)
            assert advantages[i, t].item() == pytest.approx(
                to_go - baselines[i].item() * mask[i, t].item(), abs=1e-12
            )
    order = torch.tensor([2, 0, 1, 5, 4, 3])
    permuted = remax_advantages(rewards[order], mask[order], baselines[order])
    torch.testing.assert_close(permuted[0], advantages[order])
    with pytest.raises(ValueError, match="reward_baselines"):
        remax_advantages(rewards, mask, baselines[:3])
