"""Checks OTB and TIR-OTB: hand-computed baselines, zero tail, Python loops, compaction, invariances."""

import math

import pytest
import torch

from stratarl.algo.advantages.optimal_token_baseline import (
    optimal_token_baseline_advantages,
    tir_optimal_token_baseline_advantages,
)

EPS = 1e-8


def _returns_and_weights(rewards, mask, w_step):
    """G_t = Σ_{s≥t} r_s·m_s and W_t = Σ_{s≤t} w_s·m_s, per row, as nested lists."""
    t_len = len(rewards[0])
    g_ret = [
        [sum(r[s] * m[s] for s in range(t, t_len)) for t in range(t_len)]
        for r, m in zip(rewards, mask, strict=True)
    ]
    w_cum = [
        [sum(w[s] * m[s] for s in range(t + 1)) for t in range(t_len)]
        for w, m in zip(w_step, mask, strict=True)
    ]
    return g_ret, w_cum


def _advantage_loop(g_ret, w_cum, mask, group, tail, members):
    """A = (G − B)·m with B = Σ G·W·m / (Σ W·m + ε) over each group's members, per column."""
    n, t_len = len(g_ret), len(g_ret[0])
    base = [[0.0] * t_len for _ in range(n)]
    for g in set(group):
        rows = [i for i in range(n) if group[i] == g and members[i]]
        if len(rows) < 2:
            continue
        for t in range(t_len):
            num = sum(g_ret[i][t] * w_cum[i][t] * mask[i][t] for i in rows)
            den = sum(w_cum[i][t] * mask[i][t] for i in rows) + EPS
            for i in rows:
                base[i][t] = num / den
        lengths = sorted(sum(mask[i]) for i in rows)
        longest = [i for i in rows if sum(mask[i]) == lengths[-1]]
        if tail and len(longest) == 1 and lengths[-1] > lengths[-2]:
            for t in range(lengths[-2], t_len):
                base[longest[0]][t] = 0.0
    return [[(g_ret[i][t] - base[i][t]) * mask[i][t] for t in range(t_len)] for i in range(n)]


def _otb_loop(rewards, mask, group, w_step, tail):
    g_ret, w_cum = _returns_and_weights(rewards, mask, w_step)
    return _advantage_loop(g_ret, w_cum, mask, group, tail, [True] * len(rewards)), g_ret


def _tir_loop(rewards, mask, group, w_step, tail):
    """Pack each row's action tokens (and their G, W) to the left, run the OTB loop there, scatter back."""
    g_ret, w_cum = _returns_and_weights(rewards, mask, w_step)
    cols = [[t for t, m in enumerate(row) if m] for row in mask]
    width = max(len(c) for c in cols)
    g_packed = [[g[c] for c in cs] + [0.0] * (width - len(cs)) for g, cs in zip(g_ret, cols, strict=True)]
    w_packed = [[w[c] for c in cs] + [0.0] * (width - len(cs)) for w, cs in zip(w_cum, cols, strict=True)]
    m_packed = [[1] * len(cs) + [0] * (width - len(cs)) for cs in cols]
    members = [len(cs) > 0 for cs in cols]
    adv_packed = _advantage_loop(g_packed, w_packed, m_packed, group, tail, members)
    adv = [[0.0] * len(mask[0]) for _ in mask]
    for i, cs in enumerate(cols):
        for k, c in enumerate(cs):
            adv[i][c] = adv_packed[i][k]
    return adv, g_ret


def _random_batch(seed, n=12, width=6, gaps=False):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, width + 1, (n,), generator=gen)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    if gaps:
        mask = mask * (torch.rand(n, width, generator=gen) > 0.3).long()
    rewards = torch.randn(n, width, generator=gen, dtype=torch.float64)
    log_prob = -3 * torch.rand(n, width, generator=gen, dtype=torch.float64)
    pi = log_prob.exp()
    sum_pi_sq = pi**2 + (1 - pi) ** 2 * torch.rand(n, width, generator=gen, dtype=torch.float64)
    group = torch.randint(0, 4, (n,), generator=gen)
    return rewards, mask, group, log_prob, sum_pi_sq


def test_otb_hand_computed_two_samples():
    # Row A: π = 0.5, Σπ² = 0.5 -> w = 1 − 1 + 0.5 = 0.5 per step, W = [0.5, 1.0]; r = [0, 1] -> G = [1, 1].
    # Row B: π = [0.25, 0.5], Σπ² = [0.25, 0.5] -> w = [0.75, 0.5], W = [0.75, 1.25]; r = 0 -> G = [0, 0].
    # B_0 = (1·0.5 + 0)/(0.5 + 0.75) = 0.4,   B_1 = (1·1 + 0)/(1 + 1.25) = 4/9.
    pi = torch.tensor([[0.5, 0.5], [0.25, 0.5]], dtype=torch.float64)
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    mask, group = torch.ones(2, 2), torch.tensor([0, 0])
    advantages, returns = optimal_token_baseline_advantages(rewards, mask, group, pi.log(), pi.clone())
    torch.testing.assert_close(returns, torch.tensor([[1.0, 1.0], [0.0, 0.0]], dtype=torch.float64))
    expected = torch.tensor([[1 - 0.4, 1 - 4 / 9], [-0.4, -4 / 9]], dtype=torch.float64)
    torch.testing.assert_close(advantages, expected, atol=1e-7, rtol=0)
    # IS weight ρ = 2 on A's first token: w_A = [0.5·4, 0.5] -> W_A = [2, 2.5];
    # B_0 = 2/(2 + 0.75) = 8/11,  B_1 = 2.5/(2.5 + 1.25) = 2/3.
    rho = torch.tensor([[2.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    weighted, _ = optimal_token_baseline_advantages(rewards, mask, group, pi.log(), pi.clone(), rho)
    expected = torch.tensor([[1 - 8 / 11, 1 - 2 / 3], [-8 / 11, -2 / 3]], dtype=torch.float64)
    torch.testing.assert_close(weighted, expected, atol=1e-7, rtol=0)


def test_otb_zero_tail_and_lone_sample():
    # Group 0: lengths [3, 1, 1]: row 0 is the unique longest, L₂ = 1, so its baseline is 0 from
    # column 1 on and A = G there. Without the zero tail, columns 1-2 hold only row 0, so
    # B = G·W/(W + 1e-8) ≈ G and A ≈ 0. Group 1 (row 3) is alone: no baseline, A = G.
    rewards = torch.tensor([[0, 0, 2.0], [1.0, 0, 0], [0.5, 0, 0], [0, 3.0, 0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 0, 0], [1, 1, 0]])
    group = torch.tensor([0, 0, 0, 1])
    log_prob = torch.full((4, 3), math.log(0.5), dtype=torch.float64)
    sum_pi_sq = torch.full((4, 3), 0.5, dtype=torch.float64)  # w = 0.5 everywhere
    advantages, returns = optimal_token_baseline_advantages(rewards, mask, group, log_prob, sum_pi_sq)
    torch.testing.assert_close(advantages[0, 1:], returns[0, 1:])  # G = [2, 2] on the tail
    torch.testing.assert_close(advantages[3], returns[3] * mask[3])
    # Column 0: W = 0.5 for all three, G = [2, 1, 0.5] -> B_0 = 3.5/3 (+ε); A_0 = G − 7/6.
    torch.testing.assert_close(advantages[:3, 0], torch.tensor([2, 1, 0.5], dtype=torch.float64) - 7 / 6)
    no_tail, _ = optimal_token_baseline_advantages(
        rewards, mask, group, log_prob, sum_pi_sq, handle_zero_tail=False
    )
    assert no_tail[0, 1:].abs().max().item() < 1e-6


@pytest.mark.parametrize("tail", [True, False])
@pytest.mark.parametrize("use_is", [False, True])
def test_otb_and_tir_match_python_loops(tail, use_is):
    rewards, mask, group, log_prob, sum_pi_sq = _random_batch(seed=int(tail) + 2 * int(use_is), gaps=True)
    rho = torch.rand(mask.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64) * 2
    w_step = ((1 - 2 * log_prob.exp() + sum_pi_sq) * (rho**2 if use_is else 1)).tolist()
    args = (rewards, mask, group, log_prob, sum_pi_sq, rho if use_is else None)
    lists = (rewards.tolist(), mask.tolist(), group.tolist(), w_step, tail)
    for fn, loop in [
        (optimal_token_baseline_advantages, _otb_loop),
        (tir_optimal_token_baseline_advantages, _tir_loop),
    ]:
        advantages, returns = fn(*args, handle_zero_tail=tail)
        expected_adv, expected_ret = loop(*lists)
        torch.testing.assert_close(
            advantages, torch.tensor(expected_adv, dtype=torch.float64), atol=1e-9, rtol=0
        )
        torch.testing.assert_close(
            returns, torch.tensor(expected_ret, dtype=torch.float64), atol=1e-12, rtol=0
        )


@pytest.mark.parametrize("tail", [True, False])
def test_tir_action_tokens_do_not_see_observation_tokens(tail):
    # TIR-OTB on multi-turn rows equals TIR-OTB on the same rows with the observation tokens removed.
    rewards, mask, group, log_prob, sum_pi_sq = _random_batch(seed=11, n=6, width=8, gaps=True)
    mask[:, 0] = 1
    advantages, _ = tir_optimal_token_baseline_advantages(
        rewards, mask, group, log_prob, sum_pi_sq, handle_zero_tail=tail
    )
    width = int(mask.sum(-1).max())
    packed = [torch.zeros(6, width, dtype=torch.float64) for _ in range(3)]
    for i in range(6):
        cols = mask[i].bool()
        for tensor, source in zip(packed, (rewards, log_prob, sum_pi_sq), strict=True):
            tensor[i, : int(cols.sum())] = source[i, cols]
    packed_mask = (torch.arange(width)[None, :] < mask.sum(-1)[:, None]).long()
    compact, _ = tir_optimal_token_baseline_advantages(
        packed[0], packed_mask, group, packed[1], packed[2], handle_zero_tail=tail
    )
    torch.testing.assert_close(advantages[mask.bool()], compact[packed_mask.bool()])


@pytest.mark.parametrize("tail", [True, False])
def test_otb_equals_tir_without_observation_gaps_and_both_ignore_padding_and_order(tail):
    rewards, mask, group, log_prob, sum_pi_sq = _random_batch(seed=21)
    mask[:, 0] = 1  # no empty rows (OTB counts them in a group's size, TIR does not)
    args = (rewards, mask, group, log_prob, sum_pi_sq)
    otb, _ = optimal_token_baseline_advantages(*args, handle_zero_tail=tail)
    tir, _ = tir_optimal_token_baseline_advantages(*args, handle_zero_tail=tail)
    torch.testing.assert_close(otb, tir)
    pad = torch.rand(12, 3, dtype=torch.float64)
    padded = [
        torch.cat([x, pad.to(x.dtype) if i != 1 else torch.zeros(12, 3, dtype=x.dtype)], 1)
        for i, x in enumerate(args[:2])
    ]
    padded_args = (*padded, group, torch.cat([log_prob, -pad], 1), torch.cat([sum_pi_sq, pad], 1))
    order = torch.randperm(12, generator=torch.Generator().manual_seed(3))
    for fn, expected in [
        (optimal_token_baseline_advantages, otb),
        (tir_optimal_token_baseline_advantages, tir),
    ]:
        torch.testing.assert_close(fn(*padded_args, handle_zero_tail=tail)[0][:, :6], expected)
        permuted = fn(*(x[order] for x in args), handle_zero_tail=tail)[0]
        torch.testing.assert_close(permuted, expected[order])


@pytest.mark.parametrize("fn", [optimal_token_baseline_advantages, tir_optimal_token_baseline_advantages])
def test_empty_rows_and_an_all_empty_group_give_zero_not_nan(fn):
    rewards = torch.ones(4, 3)
    mask = torch.tensor([[0, 0, 0], [0, 0, 0], [1, 1, 0], [0, 0, 0]])
    group = torch.tensor([0, 0, 1, 1])
    log_prob, sum_pi_sq = torch.full((4, 3), -0.5), torch.full((4, 3), 0.6)
    advantages, returns = fn(rewards, mask, group, log_prob, sum_pi_sq)
    assert torch.isfinite(advantages).all()
    assert advantages[[0, 1, 3]].abs().max().item() == 0.0
    # Row 2 is the only non-empty member of group 1: with the zero tail (L₂ = 0) it keeps A = G.
    torch.testing.assert_close(advantages[2], returns[2] * mask[2])
