"""Checks RLOO, OPO, GPG, REINFORCE++-baseline: hand-computed groups, loops, invariances, edge cases."""

import statistics

import pytest
import torch

from stratarl.algo.advantages.group_baseline import (
    gpg_advantages,
    opo_advantages,
    reinforce_plus_plus_baseline_advantages,
    rloo_advantages,
    rloo_vectorized_advantages,
)

ESTIMATORS = [
    rloo_advantages,
    rloo_vectorized_advantages,
    opo_advantages,
    gpg_advantages,
    reinforce_plus_plus_baseline_advantages,
]


def _outcome_batch(scores, lengths, width):
    """Rewards on the last action token of right-padded rows, as the reward layer writes them."""
    rewards = torch.zeros(len(scores), width, dtype=torch.float64)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    for i, (score, length) in enumerate(zip(scores, lengths, strict=True)):
        rewards[i, max(length - 1, 0)] = score
    return rewards, mask


def _random_batch(seed, n=30, width=5):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(n, generator=gen, dtype=torch.float64)
    scores[torch.rand(n, generator=gen) < 0.3] = 0.0  # some zero outcomes (GPG's α counts them)
    lengths = torch.randint(1, width + 1, (n,), generator=gen).tolist()
    group = torch.randint(0, 10, (n,), generator=gen)
    return scores.tolist(), lengths, group


def _peers(values, group, i):
    return [v for v, g in zip(values, group, strict=True) if g == group[i]]


def test_rloo_hand_computed_and_the_lone_sample_conventions():
    # Group 0: R = [2, 4, 9], n = 3, Σ = 15: Â = (3R − 15)/2 = [−4.5, −1.5, 6] (2 − mean(4, 9) = −4.5).
    # Group 1: one sample R = 5: `rloo` keeps Â = R = 5, `rloo_vectorized` gives 0.
    rewards, mask = _outcome_batch([2.0, 4.0, 9.0, 5.0], [1, 2, 2, 2], 2)
    group = torch.tensor([0, 0, 0, 1])
    advantages, returns = rloo_advantages(rewards, mask, group)
    expected = torch.tensor([[-4.5, 0.0], [-1.5, -1.5], [6.0, 6.0], [5.0, 5.0]], dtype=torch.float64)
    torch.testing.assert_close(advantages, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(returns, advantages)
    vectorized, _ = rloo_vectorized_advantages(rewards, mask, group)
    expected[3] = 0.0
    torch.testing.assert_close(vectorized, expected, atol=1e-12, rtol=0)


def test_opo_hand_computed_length_weighted_baseline():
    # Group 0: lengths [1, 3], R = [1, 0]: b = (1·1 + 3·0)/(1 + 3) = 0.25, Â = [0.75, −0.25].
    # Group 1: one sample, b = 0, Â = R = 2. Group 2: two empty rows, Σ|y| = 0: b = 0, Â·m = 0.
    rewards, mask = _outcome_batch([1.0, 0.0, 2.0, 1.0, 3.0], [1, 3, 2, 0, 0], 3)
    group = torch.tensor([0, 0, 1, 2, 2])
    advantages, _ = opo_advantages(rewards, mask, group)
    expected = torch.tensor(
        [[0.75, 0, 0], [-0.25] * 3, [2.0, 2.0, 0], [0.0] * 3, [0.0] * 3], dtype=torch.float64
    )
    torch.testing.assert_close(advantages, expected, atol=1e-12, rtol=0)
    assert torch.isfinite(advantages).all()


def test_gpg_hand_computed():
    # R = [1, 0 | 0, 3]: 2 non-zero of N = 4, α = 4/2 = 2. Group means 0.5 and 1.5:
    # Â = 2·[0.5, −0.5, −1.5, 1.5] = [1, −1, −3, 3]; f_norm = 2 halves them.
    rewards, mask = _outcome_batch([1.0, 0.0, 0.0, 3.0], [2, 2, 1, 2], 2)
    group = torch.tensor([0, 0, 1, 1])
    advantages, _ = gpg_advantages(rewards, mask, group)
    expected = torch.tensor([[1.0, 1.0], [-1.0, -1.0], [-3.0, 0.0], [3.0, 3.0]], dtype=torch.float64)
    torch.testing.assert_close(advantages, expected, atol=1e-12, rtol=0)
    halved, _ = gpg_advantages(rewards, mask, group, f_norm=2.0)
    torch.testing.assert_close(halved, expected / 2, atol=1e-12, rtol=0)
    nothing, _ = gpg_advantages(torch.zeros_like(rewards), mask, group)  # α = 4/max(0, 1), Â = 0
    assert nothing.abs().max().item() == 0.0


def test_reinforce_plus_plus_baseline_hand_computed():
    # Groups {0, 1}, {2}: R = [1, 0 | 5]. Centered: [0.5, −0.5 | 5] (a lone sample keeps mean 0).
    # Masks [[1,1],[1,0],[1,1]] give the tokens {0.5, 0.5, −0.5, 5, 5}: mean 10.5/5 = 2.1,
    # Σ(x−μ)² = 2·1.6² + 2.6² + 2·2.9² = 5.12 + 6.76 + 16.82 = 28.7, unbiased var = 28.7/4 = 7.175.
    rewards, mask = _outcome_batch([1.0, 0.0, 5.0], [2, 1, 2], 2)
    advantages, returns = reinforce_plus_plus_baseline_advantages(rewards, mask, torch.tensor([0, 0, 1]))
    centered = torch.tensor([[0.5, 0.5], [-0.5, 2.1], [5.0, 5.0]], dtype=torch.float64)
    expected = (centered - 2.1) / (7.175 + 1e-8) ** 0.5 * mask
    torch.testing.assert_close(advantages, expected, atol=1e-9, rtol=0)
    torch.testing.assert_close(returns, advantages)


def test_group_baselines_match_python_loops():
    scores, lengths, group = _random_batch(0)
    rewards, mask = _outcome_batch(scores, lengths, 5)
    g, n = group.tolist(), len(scores)
    rloo, rloo_vec, opo, gpg = [], [], [], []
    alpha = n / max(sum(s != 0 for s in scores), 1)
    for i, score in enumerate(scores):
        peers, peer_lengths = _peers(scores, g, i), _peers(lengths, g, i)
        others = (sum(peers) - score) / (len(peers) - 1) if len(peers) > 1 else None
        rloo.append(score if others is None else score - others)
        rloo_vec.append(0.0 if others is None else score - others)
        baseline = sum(a * b for a, b in zip(peer_lengths, peers, strict=True)) / sum(peer_lengths)
        opo.append(score - (baseline if len(peers) > 1 else 0.0))
        gpg.append(alpha * (score - (statistics.mean(peers) if len(peers) > 1 else 0.0)))
    for fn, per_row in [
        (rloo_advantages, rloo),
        (rloo_vectorized_advantages, rloo_vec),
        (opo_advantages, opo),
        (gpg_advantages, gpg),
    ]:
        advantages, _ = fn(rewards, mask, group)
        expected = torch.tensor(per_row, dtype=torch.float64)[:, None] * mask
        torch.testing.assert_close(advantages, expected, atol=1e-10, rtol=0, msg=fn.__name__)


def test_reinforce_plus_plus_baseline_matches_a_python_loop():
    scores, lengths, group = _random_batch(1)
    rewards, mask = _outcome_batch(scores, lengths, 5)
    g = group.tolist()
    centered = [
        s - (statistics.mean(_peers(scores, g, i)) if g.count(g[i]) > 1 else 0.0)
        for i, s in enumerate(scores)
    ]
    tokens = [centered[i] for i, length in enumerate(lengths) for _ in range(length)]
    mean, var = statistics.mean(tokens), statistics.variance(tokens)
    expected = (torch.tensor(centered, dtype=torch.float64)[:, None] - mean) / (var + 1e-8) ** 0.5 * mask
    advantages, _ = reinforce_plus_plus_baseline_advantages(rewards, mask, group)
    torch.testing.assert_close(advantages, expected, atol=1e-10, rtol=0)


@pytest.mark.parametrize("estimator", ESTIMATORS, ids=lambda fn: fn.__name__)
def test_permutation_relabeling_and_padding_change_nothing(estimator):
    scores, lengths, group = _random_batch(2, n=20)
    rewards, mask = _outcome_batch(scores, lengths, 5)
    advantages, returns = estimator(rewards, mask, group)
    order = torch.randperm(20, generator=torch.Generator().manual_seed(5))
    relabeled = (group * 3 + 11)[order]  # the same partition under other ids
    permuted, _ = estimator(rewards[order], mask[order], relabeled)
    torch.testing.assert_close(permuted, advantages[order])
    pad = torch.zeros(20, 3, dtype=rewards.dtype)
    padded, padded_returns = estimator(torch.cat([rewards, pad], 1), torch.cat([mask, pad.long()], 1), group)
    torch.testing.assert_close(padded[:, :5], advantages)
    torch.testing.assert_close(padded_returns[:, :5], returns)
    assert padded[:, 5:].abs().max().item() == 0.0


@pytest.mark.parametrize("estimator", ESTIMATORS, ids=lambda fn: fn.__name__)
def test_equal_rewards_give_zero_and_empty_rows_stay_zero(estimator):
    # Every group has ≥ 2 samples with the same outcome: no sample beats its peers. GPG: α·0 = 0.
    # RF++-baseline whitens all-zero centered scores: (0 − 0)/√1e-8 = 0. Row 5 is fully masked.
    rewards, mask = _outcome_batch([1.0, 1.0, 1.0, 0.5, 0.5, 0.5], [2, 3, 1, 3, 3, 0], 3)
    advantages, _ = estimator(rewards, mask, torch.tensor([0, 0, 0, 1, 1, 1]))
    assert advantages.abs().max().item() == 0.0


def test_rejects_a_group_of_the_wrong_length():
    rewards, mask = _outcome_batch([1.0, 2.0], [1, 1], 1)
    with pytest.raises(ValueError, match="group"):
        rloo_advantages(rewards, mask, torch.tensor([0, 0, 1]))
