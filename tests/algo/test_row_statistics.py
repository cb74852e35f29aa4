"""Per-trajectory update statistics (the trace's question 9): hand-computed rows, a plain loop, pad rows."""

import math

import torch

from stratarl.algo.row_statistics import ratio_statistics_per_row


def test_one_row_by_hand():
    # tokens: log r = [log 1.5, log 0.5, 0]; A = [+1, -1, +1]; mask [1, 1, 0]
    old = torch.zeros(1, 3)
    new = torch.tensor([[math.log(1.5), math.log(0.5), 7.0]])
    stats = ratio_statistics_per_row(
        log_prob=new, old_log_prob=old, advantages=torch.tensor([[1.0, -1.0, 1.0]]),
        response_mask=torch.tensor([[1, 1, 0]]), clip_ratio_low=0.2, clip_ratio_high=0.2,
    )  # fmt: skip
    assert stats["tokens"].tolist() == [2.0]
    assert stats["ratio_mean"].item() == torch.tensor(1.0).item()  # (1.5 + 0.5) / 2
    assert stats["ratio_min"].item() == 0.5 and abs(stats["ratio_max"].item() - 1.5) < 1e-6
    # 1.5 > 1.2 with A > 0 clips, 0.5 < 0.8 with A < 0 clips: both action tokens
    assert stats["clipped_share"].item() == 1.0
    assert abs(stats["new_log_prob_mean"].item() - (math.log(1.5) + math.log(0.5)) / 2) < 1e-6


def test_matches_a_plain_loop_and_pad_rows_are_nan():
    torch.manual_seed(0)
    n, t = 5, 7
    old, new, adv = torch.randn(n, t), torch.randn(n, t) * 0.3, torch.randn(n, t)
    mask = (torch.rand(n, t) > 0.3).long()
    mask[3] = 0  # a zero-weight pad row
    stats = ratio_statistics_per_row(log_prob=new, old_log_prob=old, advantages=adv, response_mask=mask)
    for i in range(n):
        idx = [j for j in range(t) if mask[i, j]]
        if not idx:
            assert stats["tokens"][i] == 0 and math.isnan(stats["ratio_mean"][i])
            continue
        ratios = [math.exp(new[i, j] - old[i, j]) for j in idx]
        clipped = [
            (adv[i, j] > 0 and r > 1.2) or (adv[i, j] < 0 and r < 0.8)
            for j, r in zip(idx, ratios, strict=True)
        ]
        assert abs(stats["ratio_mean"][i] - sum(ratios) / len(idx)) < 1e-5
        assert abs(stats["log_ratio_mean"][i] - sum(new[i, j] - old[i, j] for j in idx) / len(idx)) < 1e-5
        assert abs(stats["clipped_share"][i] - sum(clipped) / len(idx)) < 1e-6
        assert abs(stats["ratio_max"][i] - max(ratios)) < 1e-5
