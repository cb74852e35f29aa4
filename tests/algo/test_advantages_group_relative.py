"""Checks GRPO, Dr. GRPO, GRPO pass@k, GDPO: hand-computed groups, Python loops, invariances, edge cases."""

import statistics

import numpy as np
import pytest
import torch

from stratarl.algo.advantages import get_advantage_estimator
from stratarl.algo.advantages.group_relative import (
    gdpo_advantages,
    grpo_advantages,
    grpo_passk_advantages,
    grpo_statistics,
)

EPS = 1e-6


def _outcome_batch(scores, lengths, width):
    """Rewards on the last action token of right-padded rows, as the reward layer writes them."""
    rewards = torch.zeros(len(scores), width, dtype=torch.float64)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    for i, (score, length) in enumerate(zip(scores, lengths, strict=True)):
        rewards[i, max(length - 1, 0)] = score
    return rewards, mask


def _grpo_loop(scores, group, norm):
    """Per-row GRPO with statistics from Python's `statistics` (stdev is Bessel-corrected)."""
    out = []
    for i, score in enumerate(scores):
        peers = [s for s, g in zip(scores, group, strict=True) if g == group[i]]
        mean, std = (0.0, 1.0) if len(peers) == 1 else (statistics.mean(peers), statistics.stdev(peers))
        out.append((score - mean) / (std + EPS) if norm else score - mean)
    return out


def _whiten_loop(per_row, mask):
    picked = [per_row[i] for i, row in enumerate(mask) for m in row if m]
    mean, var = statistics.mean(picked), statistics.variance(picked)
    return [[(per_row[i] - mean) / (var + 1e-8) ** 0.5 * m for m in row] for i, row in enumerate(mask)]


def test_grpo_hand_computed_with_a_group_of_one():
    # Group 0: R = [1, 0, 0, 1], mean 0.5, Σ(R−μ)² = 4·0.25 = 1, unbiased var = 1/3, std = 0.57735;
    #   Â = ±0.5 / (0.57735 + 1e-6) = ±0.8660239.   Group 1: one sample R = 2, mean 0, std 1: Â = 2/(1+1e-6).
    rewards, mask = _outcome_batch([1.0, 0.0, 0.0, 1.0, 2.0], [3, 1, 2, 3, 2], 3)
    group = torch.tensor([0, 0, 0, 0, 1])
    advantages, returns = grpo_advantages(rewards, mask, group)
    a = 0.5 / (1 / 3**0.5 + EPS)
    expected = torch.tensor(
        [[a, a, a], [-a, 0, 0], [-a, -a, 0], [a, a, a], [2 / (1 + EPS)] * 2 + [0]], dtype=torch.float64
    )
    torch.testing.assert_close(advantages, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(returns, advantages)
    # Dr. GRPO: no division, Â = R − mean = ±0.5, and the lone sample keeps R = 2.
    dr_grpo, _ = grpo_advantages(rewards, mask, group, norm_adv_by_std=False)
    expected = torch.tensor([[0.5] * 3, [-0.5, 0, 0], [-0.5, -0.5, 0], [0.5] * 3, [2.0, 2.0, 0]])
    torch.testing.assert_close(dr_grpo, expected.double(), atol=1e-12, rtol=0)  # exact in binary


def test_grpo_matches_a_python_loop():
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(30, generator=gen, dtype=torch.float64).tolist()
    lengths = torch.randint(0, 6, (30,), generator=gen).tolist()
    group = torch.randint(0, 9, (30,), generator=gen)
    rewards, mask = _outcome_batch(scores, lengths, 6)
    for norm in (True, False):
        advantages, _ = grpo_advantages(rewards, mask, group, norm_adv_by_std=norm)
        per_row = _grpo_loop(scores, group.tolist(), norm)
        torch.testing.assert_close(
            advantages, torch.tensor(per_row, dtype=torch.float64)[:, None] * mask, atol=1e-10, rtol=0
        )


def test_grpo_equal_rewards_empty_rows_padding_and_permutation():
    # All-equal group: R − μ = 0 exactly, so Â = 0/(0 + ε) = 0. The empty row (length 0) still
    # counts in its group's statistics, as in verl: {1, 0} -> mean 0.5, std √0.5 -> Â_0 = 0.5/0.70711.
    rewards, mask = _outcome_batch([0.5, 0.5, 0.5, 1.0, 0.0], [2, 3, 1, 3, 0], 3)
    group = torch.tensor([0, 0, 0, 1, 1])
    advantages, _ = grpo_advantages(rewards, mask, group)
    assert advantages[:3].abs().max().item() == 0.0
    assert advantages[3].tolist() == pytest.approx([0.5 / (0.5**0.5 + EPS)] * 3, abs=1e-9)
    assert advantages[4].tolist() == [0.0, 0.0, 0.0]
    padded, _ = grpo_advantages(
        torch.cat([rewards, torch.zeros(5, 2, dtype=rewards.dtype)], 1),
        torch.cat([mask, torch.zeros(5, 2)], 1),
        group,
    )
    torch.testing.assert_close(padded[:, :3], advantages)
    assert padded[:, 3:].abs().max().item() == 0.0
    order = torch.tensor([4, 1, 3, 0, 2])  # moves rows within and between groups
    relabeled = torch.tensor([7, 3])[group]  # other, non-contiguous ids: same partition
    permuted, _ = grpo_advantages(rewards[order], mask[order], relabeled[order])
    torch.testing.assert_close(permuted, advantages[order])


def test_grpo_passk_hand_computed():
    # Group 0: R = [1, 3, 2]: best 3 (row 1), runner-up 2, std: mean 2, Σ(R−μ)² = 2, /2 = 1 -> Â_1 = 1/(1+ε).
    # Group 1: R = [1, 1, 0]: a tie at the top gives 1 − 1 = 0 for everyone.
    rewards, mask = _outcome_batch([1.0, 3.0, 2.0, 1.0, 1.0, 0.0], [2, 2, 1, 2, 1, 2], 2)
    group = torch.tensor([0, 0, 0, 1, 1, 1])
    advantages, returns = grpo_passk_advantages(rewards, mask, group)
    expected = torch.zeros(6, 2, dtype=torch.float64)
    expected[1] = 1 / (1 + EPS)
    torch.testing.assert_close(advantages, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(returns, advantages)
    unnormalized, _ = grpo_passk_advantages(rewards, mask, group, norm_adv_by_std=False)
    assert unnormalized[1].tolist() == [1.0, 1.0]  # 3 − 2
    with pytest.raises(ValueError, match="at least 2"):
        grpo_passk_advantages(rewards, mask, torch.tensor([0, 0, 0, 1, 1, 2]))


def test_grpo_passk_matches_a_python_loop_and_follows_permutations():
    gen = torch.Generator().manual_seed(1)
    group = torch.arange(8).repeat_interleave(4)[torch.randperm(32, generator=gen)]
    scores = torch.randint(0, 4, (32,), generator=gen).double().tolist()  # many ties
    rewards, mask = _outcome_batch(scores, torch.randint(1, 5, (32,), generator=gen).tolist(), 4)
    advantages, _ = grpo_passk_advantages(rewards, mask, group)
    expected = [0.0] * 32
    for g in range(8):
        members = [i for i in range(32) if group[i] == g]
        ranked = sorted((scores[i] for i in members), reverse=True)
        winner = max(members, key=lambda i: scores[i])
        expected[winner] = (ranked[0] - ranked[1]) / (statistics.stdev(scores[i] for i in members) + EPS)
    torch.testing.assert_close(
        advantages, torch.tensor(expected, dtype=torch.float64)[:, None] * mask, atol=1e-10, rtol=0
    )
    order = torch.randperm(32, generator=gen)
    permuted, _ = grpo_passk_advantages(rewards[order], mask[order], group[order])
    torch.testing.assert_close(permuted, advantages[order])


def test_gdpo_hand_computed_two_components():
    # Groups {0, 1}, {2, 3}; one action token each. Components, normalized per group (n = 2):
    #   fmt = [1, 0 | 1, 1]: ±0.5/(√0.5 + ε) = ±a on group 0, 0 on the tied group 1
    #   acc = [3, 1 | 0, 2]: ±1/(√2 + ε) = ±b on both groups (row 2 gets −b)
    # weights [1, 2]: Σ = [a + 2b, −a − 2b, −2b, 2b], mean 0, unbiased var = (2(a+2b)² + 2(2b)²)/3,
    # then A = Σ / √(var + 1e-8).
    mask = torch.ones(4, 1)
    group = torch.tensor([0, 0, 1, 1])
    components = {
        "fmt": torch.tensor([1.0, 0.0, 1.0, 1.0]),
        "acc": np.array([3.0, 1.0, 0.0, 2.0], dtype=object),
    }
    advantages, returns = gdpo_advantages(components, mask, group, weights=[1.0, 2.0])
    a, b = 0.5 / (0.5**0.5 + EPS), 1 / (2**0.5 + EPS)
    total = torch.tensor([a + 2 * b, -a - 2 * b, -2 * b, 2 * b])
    var = (2 * (a + 2 * b) ** 2 + 2 * (2 * b) ** 2) / 3
    torch.testing.assert_close(advantages, (total / (var + 1e-8) ** 0.5)[:, None], atol=1e-6, rtol=0)
    torch.testing.assert_close(returns, advantages)


def test_gdpo_matches_a_python_loop_with_multi_turn_masks():
    gen = torch.Generator().manual_seed(2)
    n = 24
    group = torch.randint(0, 7, (n,), generator=gen)
    mask = (torch.rand(n, 5, generator=gen) < 0.6).long()
    mask[:, 0] = 1
    components = [torch.randint(0, 2, (n,), generator=gen).float(), torch.randn(n, generator=gen)]
    for norm in (True, False):
        advantages, _ = gdpo_advantages(components, mask, group, weights=[0.3, 1.7], norm_adv_by_std=norm)
        per_k = [_grpo_loop(c.tolist(), group.tolist(), norm) for c in components]
        total = [0.3 * x + 1.7 * y for x, y in zip(*per_k, strict=True)]
        expected = torch.tensor(_whiten_loop(total, mask.tolist()), dtype=torch.float32)
        torch.testing.assert_close(advantages, expected, atol=1e-5, rtol=1e-5)


def test_gdpo_one_component_is_whitened_grpo_and_bad_weights_raise():
    gen = torch.Generator().manual_seed(3)
    rewards, mask = _outcome_batch(torch.randn(8, generator=gen).tolist(), [3, 1, 2, 3, 3, 2, 1, 3], 3)
    rewards, group = rewards.float(), torch.tensor([0, 0, 1, 1, 1, 2, 3, 3])
    grpo, _ = grpo_advantages(rewards, mask, group)
    gdpo, _ = gdpo_advantages([rewards.sum(-1)], mask, group)
    mean = grpo[mask.bool()].mean()
    std = grpo[mask.bool()].std()
    torch.testing.assert_close(gdpo, (grpo - mean) / std * mask, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="weights"):
        gdpo_advantages([rewards.sum(-1)], mask, group, weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="component_scores\\[0\\]"):
        gdpo_advantages([torch.zeros(3)], mask, group)


@pytest.mark.parametrize("norm", [True, False])
def test_grpo_statistics_are_the_numbers_the_advantage_was_computed_from(norm):
    # Group 0 as above: μ = 0.5, σ = 0.57735 (unbiased, not the population 0.5); the lone row: μ 0, σ 1.
    rewards, mask = _outcome_batch([1.0, 0.0, 0.0, 1.0, 2.0], [3, 1, 2, 3, 2], 3)
    group = torch.tensor([0, 0, 0, 0, 1])
    stats = get_advantage_estimator("grpo").explain(
        {"token_level_rewards": rewards, "response_mask": mask, "group": group}, norm_adv_by_std=norm
    )
    assert stats["eps"] == EPS and stats["norm_adv_by_std"] is norm
    torch.testing.assert_close(stats["mean"], torch.tensor([0.5] * 4 + [0.0], dtype=torch.float64))
    torch.testing.assert_close(stats["std"], torch.tensor([1 / 3**0.5] * 4 + [1.0], dtype=torch.float64))
    advantages, _ = grpo_advantages(rewards, mask, group, norm_adv_by_std=norm)
    by_hand = stats["score"] - stats["mean"]
    by_hand = by_hand / (stats["std"] + stats["eps"]) if norm else by_hand
    torch.testing.assert_close(advantages[:, 0], by_hand, atol=0, rtol=0)  # the same arithmetic, exactly
    assert grpo_statistics(rewards, mask, group)["std"][0] != pytest.approx(0.5)  # not the population std
