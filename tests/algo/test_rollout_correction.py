"""Checks rollout correction: IS weights (token, sequence, TIS, IcePop, batch normalization, their
metrics), rejection masks for every option alone and combined, off-policy diagnostics and the combined
call; hand values, plain loops, padding invariance and degenerate masks."""

import math

import pytest
import torch

from stratarl.algo.masked import masked_mean
from stratarl.algo.rollout_correction import (
    RS_OPTIONS,
    is_weight_sum_and_count,
    normalize_is_weights,
    offpolicy_metrics,
    rejection_mask,
    rollout_corr_metrics,
    rollout_correction,
    rollout_is_weights,
)

F64 = torch.float64
# ρ = [[3, 0.5, 1], [1.5, e^30 (bounded to e^20), pad]]
LOG_RATIO = torch.tensor([[math.log(3), math.log(0.5), 0.0], [math.log(1.5), 30.0, 0.0]], dtype=F64)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=F64)


# ---------------------------------------------------------------- IS weights


def test_token_tis_weights_and_metrics_hand_computed():
    weights, m = rollout_is_weights(LOG_RATIO, MASK, level="token", threshold=2.0)
    # raw = [[3, 0.5, 1], [1.5, e^20, 0]]; TIS min(raw, 2) = [[2, 0.5, 1], [1.5, 2, 0]]
    torch.testing.assert_close(weights, torch.tensor([[2.0, 0.5, 1.0], [1.5, 2.0, 0.0]], dtype=F64))
    assert m["rollout_is_mean"] == pytest.approx(7 / 5, rel=1e-8)  # (2 + .5 + 1 + 1.5 + 2)/5
    assert m["rollout_is_ratio_fraction_high"] == pytest.approx(2 / 5, rel=1e-8)  # raw 3 and e^20 > 2
    assert m["rollout_is_ratio_fraction_low"] == 0.0  # 0.5 is not < 1/2
    assert (m["rollout_is_max"], m["rollout_is_min"]) == (2.0, 0.5)
    # E[w²] = (4 + .25 + 1 + 2.25 + 4)/5 = 2.3, E[w]² = 1.96 → std = sqrt(0.34)
    assert m["rollout_is_std"] == pytest.approx(math.sqrt(0.34), rel=1e-7)
    assert m["rollout_is_eff_sample_size"] == pytest.approx(1.96 / 2.3, rel=1e-7)  # 1/E[(w/1.4)²]
    # row means: (2 + .5 + 1)/3 = 7/6 and (1.5 + 2)/2 = 1.75
    assert m["rollout_is_seq_mean"] == pytest.approx((7 / 6 + 1.75) / 2, rel=1e-7)
    assert m["rollout_is_seq_std"] == pytest.approx((1.75 - 7 / 6) / math.sqrt(2), rel=1e-7)
    assert m["rollout_is_seq_max_deviation"] == pytest.approx(0.75, rel=1e-7)
    # raw row means 1.5 and (1.5 + e^20)/2: one of two rows above 2
    assert (m["rollout_is_seq_fraction_high"], m["rollout_is_seq_fraction_low"]) == (0.5, 0.0)


def test_sequence_weights_and_metrics_hand_computed():
    weights, m = rollout_is_weights(LOG_RATIO, MASK, level="sequence", threshold=2.0)
    # Σ log ρ: row 0 log 1.5 → 1.5; row 1 log 1.5 + 30, bounded to 20 → e^20 → truncated to 2
    torch.testing.assert_close(weights, torch.tensor([[1.5, 1.5, 1.5], [2.0, 2.0, 0.0]], dtype=F64))
    assert m["rollout_is_mean"] == pytest.approx(8.5 / 5, rel=1e-8)  # (3·1.5 + 2·2)/5
    assert m["rollout_is_max"] == pytest.approx(math.exp(20.0), rel=1e-12)
    assert m["rollout_is_min"] == pytest.approx(1.5, rel=1e-12)
    assert m["rollout_is_ratio_fraction_high"] == 0.5  # rows with Σ log ρ > log 2


def test_icepop_zeroes_out_of_bounds_and_batch_normalization():
    weights, m = rollout_is_weights(LOG_RATIO, MASK, threshold="0.5_2.0", batch_normalize=True)
    # kept where 0.5 ≤ raw ≤ 2: [[0, .5, 1], [1.5, 0, 0]]; mean over 5 tokens = 3/5 → divided by 0.6
    torch.testing.assert_close(weights, torch.tensor([[0.0, 0.5, 1.0], [1.5, 0.0, 0.0]], dtype=F64) / 0.6)
    assert m["rollout_is_oob_ratio"] == pytest.approx(2 / 5, rel=1e-8)
    assert m["rollout_is_batch_norm_factor"] == pytest.approx(0.6, rel=1e-8)
    assert m["rollout_is_mean"] == pytest.approx(0.6, rel=1e-8)  # metrics are taken before normalizing
    seq_weights, seq_m = rollout_is_weights(LOG_RATIO, MASK, level="sequence", batch_normalize=True)
    # row weights 1.5 and 2 → mean over non-empty rows 1.75
    torch.testing.assert_close(seq_weights, torch.tensor([[1.5] * 3, [2.0, 2.0, 0.0]], dtype=F64) / 1.75)
    assert seq_m["rollout_is_batch_norm_factor"] == pytest.approx(1.75, rel=1e-8)


def test_icepop_rejecting_every_token_gives_zero_weights_and_zero_ess():
    # every raw weight (3, 0.5, 1, 1.5, e^20) lies outside [4, 5]; verl divides by zero in its ESS here
    weights, m = rollout_is_weights(LOG_RATIO, MASK, threshold="4_5", batch_normalize=True)
    assert torch.equal(weights, torch.zeros_like(weights))
    assert m["rollout_is_eff_sample_size"] == 0.0
    assert m["rollout_is_batch_norm_factor"] == 1.0  # mean 0 ≤ 1e-8: left unnormalized
    assert m["rollout_is_oob_ratio"] == pytest.approx(1.0, rel=1e-8)


def test_batch_normalization_split_over_ranks_equals_one_rank():
    gen = torch.Generator().manual_seed(0)
    log_ratio = torch.randn(6, 5, generator=gen, dtype=F64) * 0.5
    mask = (torch.rand(6, 5, generator=gen) > 0.3).to(F64)
    for level in ("token", "sequence"):
        weights, _ = rollout_is_weights(log_ratio, mask, level=level)
        parts = [
            is_weight_sum_and_count(weights[rows], mask[rows], level) for rows in (slice(0, 2), slice(2, 6))
        ]
        total, count = sum(p[0] for p in parts), sum(p[1] for p in parts)  # the all-reduce
        split = torch.cat(
            [
                normalize_is_weights(weights[r], mask[r], level, total=total, count=count)[0]
                for r in (slice(0, 2), slice(2, 6))
            ]
        )
        whole, _ = normalize_is_weights(weights, mask, level)
        torch.testing.assert_close(split, whole, rtol=1e-7, atol=0)


def test_weights_match_plain_loop_and_are_detached():
    gen = torch.Generator().manual_seed(1)
    log_ratio = (torch.randn(4, 6, generator=gen, dtype=F64) * 1.5).requires_grad_()
    mask = (torch.rand(4, 6, generator=gen) > 0.3).to(F64)
    token, _ = rollout_is_weights(log_ratio, mask, level="token", threshold=3.0)
    sequence, _ = rollout_is_weights(log_ratio, mask, level="sequence", threshold=3.0)
    assert not token.requires_grad and not sequence.requires_grad
    for i in range(4):
        row_sum = sum(log_ratio[i, t].item() for t in range(6) if mask[i, t])
        for t in range(6):
            expected_token = (
                min(math.exp(min(max(log_ratio[i, t].item(), -20), 20)), 3.0) if mask[i, t] else 0.0
            )
            expected_seq = min(math.exp(min(max(row_sum, -20), 20)), 3.0) if mask[i, t] else 0.0
            assert token[i, t].item() == pytest.approx(expected_token, rel=1e-12)
            assert sequence[i, t].item() == pytest.approx(expected_seq, rel=1e-12)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_is_padding_invariance(level):
    garbage = torch.full((2, 4), float("nan"), dtype=F64)
    padded_lr, padded_mask = (
        torch.cat([LOG_RATIO, garbage], 1),
        torch.cat([MASK, torch.zeros(2, 4, dtype=F64)], 1),
    )
    w, m = rollout_is_weights(LOG_RATIO, MASK, level=level, threshold="0.2_4")
    pw, pm = rollout_is_weights(padded_lr, padded_mask, level=level, threshold="0.2_4")
    torch.testing.assert_close(pw[:, :3], w)
    assert torch.equal(pw[:, 3:], torch.zeros(2, 4, dtype=F64))
    assert pm == pytest.approx(m, rel=1e-12)


def test_is_degenerate_and_bad_arguments():
    with pytest.raises(ValueError, match="valid token"):
        rollout_is_weights(LOG_RATIO, torch.zeros_like(MASK))
    empty_row = torch.tensor([[1, 1, 1], [0, 0, 0]], dtype=F64)
    weights, m = rollout_is_weights(LOG_RATIO, empty_row, level="sequence")
    assert torch.equal(weights[1], torch.zeros(3, dtype=F64))
    # verl counts the empty row in sequence-level max/min: its Σ log ρ = 0 gives weight 1
    assert m["rollout_is_min"] == pytest.approx(1.0)
    for bad in ("2_1", -1.0, "x", "0_2"):
        with pytest.raises(ValueError):
            rollout_is_weights(LOG_RATIO, MASK, threshold=bad)
    with pytest.raises(TypeError):
        rollout_is_weights(LOG_RATIO, MASK, threshold=True)
    with pytest.raises(ValueError, match="level"):
        rollout_is_weights(LOG_RATIO, MASK, level="geometric")


# ---------------------------------------------------------------- rejection sampling

# r = [[3, 0.6, 1], [0.4, e^0.1, pad]]
RS_LOG_RATIO = torch.tensor([[math.log(3), math.log(0.6), 0.0], [math.log(0.4), 0.1, 7.0]], dtype=F64)


@pytest.mark.parametrize(
    ("option", "threshold", "expected"),
    [
        # keep log 0.5 ≤ −log r ≤ log 2, i.e. r ∈ [0.5, 2]: rejects r = 3 and r = 0.4
        ("token_k1", "0.5_2.0", [[0, 1, 1], [0, 1, 0]]),
        ("token_k1", 2.0, [[0, 1, 1], [0, 1, 0]]),  # one number u means [1/u, u]
        # k3 = r − 1 − log r: 0.901, 0.111, 0 | 0.316, 0.005 → bound 0.3 rejects r = 3 and 0.4
        ("token_k3", 0.3, [[0, 1, 1], [0, 1, 0]]),
        # k2 = ½ log² r: 0.603, 0.130, 0 | 0.420, 0.005 → bound 0.5 rejects r = 3 only
        ("token_k2", 0.5, [[0, 1, 1], [1, 1, 0]]),
        # Σ −log r: row 0 −log 1.8 = −0.588 ∈ [−0.693, 0.693]; row 1 0.916 − 0.1 = 0.816 > 0.693
        ("seq_sum_k1", "0.5_2.0", [[1, 1, 1], [0, 0, 0]]),
        # mean −log r: −0.196 and 0.408, both inside
        ("seq_mean_k1", "0.5_2.0", [[1, 1, 1], [1, 1, 0]]),
        # max k2: 0.603 > 0.5 rejects row 0; row 1 max 0.420 kept
        ("seq_max_k2", 0.5, [[0, 0, 0], [1, 1, 0]]),
        # Σ k3: 0.901 + 0.111 + 0 = 1.012 > 1 rejected; 0.316 + 0.005 kept
        ("seq_sum_k3", 1.0, [[0, 0, 0], [1, 1, 0]]),
        # mean k2: (0.603 + 0.130)/3 = 0.244 kept at 0.25; (0.420 + 0.005)/2 = 0.2125 kept
        ("seq_mean_k2", 0.25, [[1, 1, 1], [1, 1, 0]]),
    ],
)
def test_single_option_masks_hand_computed(option, threshold, expected):
    new_mask, m = rejection_mask(RS_LOG_RATIO, MASK, option, threshold)
    assert new_mask.dtype == MASK.dtype
    torch.testing.assert_close(new_mask, torch.tensor(expected, dtype=F64))
    rejected_tokens = 5 - sum(map(sum, expected))
    assert m[f"rollout_rs_{option}_masked_fraction"] == pytest.approx(rejected_tokens / 5, rel=1e-8)
    assert m["rollout_rs_masked_fraction"] == pytest.approx(rejected_tokens / 5, rel=1e-8)


def test_sequence_option_metrics_hand_computed():
    _, m = rejection_mask(RS_LOG_RATIO, MASK, "seq_sum_k1", "0.5_2.0")
    row0, row1 = -math.log(1.8), -(math.log(0.4) + 0.1)
    assert m["rollout_rs_seq_sum_k1_mean"] == pytest.approx((3 * row0 + 2 * row1) / 5, rel=1e-8)  # per token
    assert m["rollout_rs_seq_sum_k1_seq_mean"] == pytest.approx((row0 + row1) / 2, rel=1e-12)
    assert (m["rollout_rs_seq_sum_k1_max"], m["rollout_rs_seq_sum_k1_min"]) == pytest.approx((row1, row0))
    assert m["rollout_rs_seq_sum_k1_fraction_high"] == 0.5 and m["rollout_rs_seq_sum_k1_fraction_low"] == 0.0
    assert m["rollout_rs_seq_sum_k1_seq_masked_fraction"] == 0.5
    assert m["rollout_rs_seq_sum_k1_seq_max_deviation"] == pytest.approx(row1)


def test_options_combine_with_and_and_thresholds_broadcast():
    new_mask, m = rejection_mask(RS_LOG_RATIO, MASK, "token_k1, seq_max_k2", "0.5_2.0,0.5")
    # [[0,1,1],[0,1,0]] AND [[0,0,0],[1,1,0]]
    torch.testing.assert_close(new_mask, torch.tensor([[0, 0, 0], [0, 1, 0]], dtype=F64))
    assert m["rollout_rs_masked_fraction"] == pytest.approx(4 / 5, rel=1e-8)
    assert m["rollout_rs_seq_masked_fraction"] == 1.0
    assert m["rollout_rs_token_k1_masked_fraction"] == pytest.approx(2 / 5, rel=1e-8)
    broadcast, _ = rejection_mask(RS_LOG_RATIO, MASK, "token_k2,seq_max_k2", 0.5)
    separate, _ = rejection_mask(RS_LOG_RATIO, MASK, "token_k2,seq_max_k2", "0.5,0.5")
    assert torch.equal(broadcast, separate)


def _loop_verdicts(option, log_ratio, mask, lower, upper):
    """keep[i][t] computed one row at a time, straight from the option's definition."""
    level, k = option.rsplit("_", 1)
    estimators = {"k1": lambda x: -x, "k2": lambda x: 0.5 * x * x, "k3": lambda x: math.exp(x) - 1 - x}
    keep = []
    for i in range(log_ratio.shape[0]):
        stats = [estimators[k](min(max(log_ratio[i, t].item(), -20), 20)) for t in range(log_ratio.shape[1])]
        valid = [s for s, m in zip(stats, mask[i].tolist(), strict=True) if m]
        row = {
            "seq_sum": sum(valid),
            "seq_mean": sum(valid) / (len(valid) + 1e-8),
            "seq_max": max(valid, default=0),
        }
        per_token = stats if level == "token" else [row[level]] * len(stats)
        if k == "k1":
            keep.append([math.log(lower) <= s <= math.log(upper) for s in per_token])
        else:
            keep.append([s <= upper for s in per_token])
    return torch.tensor(keep, dtype=F64) * mask


# (lower, upper) per option so that each case rejects some tokens but not all
LOOP_BOUNDS = {
    "token_k1": (0.7, 1.6),
    "seq_sum_k1": (0.5, 2.0),
    "seq_mean_k1": (0.8, 1.25),
    **{f"token_{k}": (None, 0.08) for k in ("k2", "k3")},
    **{f"seq_sum_{k}": (None, 0.3) for k in ("k2", "k3")},
    **{f"seq_mean_{k}": (None, 0.08) for k in ("k2", "k3")},
    **{f"seq_max_{k}": (None, 0.15) for k in ("k2", "k3")},
}


@pytest.mark.parametrize("option", RS_OPTIONS)
def test_every_option_matches_plain_loop(option):
    gen = torch.Generator().manual_seed(2)
    log_ratio = torch.randn(8, 6, generator=gen, dtype=F64) * 0.4
    mask = (torch.rand(8, 6, generator=gen) > 0.25).to(F64)
    mask[3] = 0  # an all-masked row
    lower, upper = LOOP_BOUNDS[option]
    spec = f"{lower}_{upper}" if lower else upper
    new_mask, m = rejection_mask(log_ratio, mask, option, spec)
    expected = _loop_verdicts(option, log_ratio, mask, lower, upper)
    torch.testing.assert_close(new_mask, expected)
    assert 0.0 < m["rollout_rs_masked_fraction"] < 1.0  # the case rejects some tokens, not all
    rows = [i for i in range(8) if mask[i].any()]
    rejected_rows = [i for i in rows if (expected[i] != mask[i]).any()]
    assert m[f"rollout_rs_{option}_seq_masked_fraction"] == pytest.approx(len(rejected_rows) / len(rows))
    assert m["rollout_rs_seq_masked_fraction"] == pytest.approx(len(rejected_rows) / 8)  # over every row


@pytest.mark.parametrize("option", ["token_k1", "seq_sum_k3", "seq_max_k2", "seq_mean_k1"])
def test_rejection_padding_invariance(option):
    threshold = "0.6_1.5" if option.endswith("k1") else 0.3
    garbage = torch.tensor([[50.0, float("nan")], [-50.0, float("inf")]], dtype=F64)
    padded_mask = torch.cat([MASK, torch.zeros(2, 2, dtype=F64)], 1)
    new_mask, m = rejection_mask(RS_LOG_RATIO, MASK, option, threshold)
    padded_new, pm = rejection_mask(torch.cat([RS_LOG_RATIO, garbage], 1), padded_mask, option, threshold)
    torch.testing.assert_close(padded_new[:, :3], new_mask)
    assert torch.equal(padded_new[:, 3:], torch.zeros(2, 2, dtype=F64))
    assert pm == pytest.approx(m, rel=1e-12)


def test_rejection_degenerate_and_bad_arguments():
    empty = torch.zeros(0, 3, dtype=F64)
    assert rejection_mask(empty, empty, "token_k2", 1.0) == (empty, {})
    with pytest.raises(ValueError, match="valid token"):
        rejection_mask(RS_LOG_RATIO, torch.zeros_like(MASK), "token_k2", 1.0)
    bad_cases = [
        ("seq_max_k1", 2.0),  # not an option
        ("token_k9", 2.0),
        ("", 2.0),
        ("token_k2", "0.5_2"),  # k2 takes one bound
        ("token_k2,token_k3", "1,2,3"),  # neither one nor one per option
        ("token_k1", "2_0.5"),  # lower > upper
        ("token_k2", -1),
        ("token_k2", None),
    ]
    for option, threshold in bad_cases:
        with pytest.raises(ValueError):
            rejection_mask(RS_LOG_RATIO, MASK, option, threshold)


# ---------------------------------------------------------------- diagnostics and the combined call


def test_offpolicy_metrics_hand_computed():
    train = torch.tensor([[math.log(0.5), math.log(0.25)]], dtype=F64)
    rollout = torch.tensor([[math.log(0.25), math.log(0.25)]], dtype=F64)
    m = offpolicy_metrics(train, rollout, torch.ones(1, 2, dtype=F64))
    # ℓ = (log ½ + log ¼)/2 = log(1/8)/2 → training ppl = √8; rollout ℓʳ = log ¼ → ppl 4
    assert m["training_ppl"] == pytest.approx(math.sqrt(8), rel=1e-7)
    assert m["training_log_ppl"] == pytest.approx(math.log(8) / 2, rel=1e-7)
    assert m["rollout_ppl"] == pytest.approx(4.0, rel=1e-7)
    assert m["rollout_log_ppl"] == pytest.approx(math.log(4), rel=1e-7)
    # log r = [log 2, 0]: kl = E[−log r] = −log2/2; k3 = ((2 − 1 − log 2) + 0)/2
    assert m["kl"] == pytest.approx(-math.log(2) / 2, rel=1e-7)
    assert m["k3_kl"] == pytest.approx((1 - math.log(2)) / 2, rel=1e-7)
    # log_ppl_diff = ℓʳ − ℓ = log(√8/4) = −½ log 2; ppl_ratio = √8/4
    assert m["log_ppl_diff"] == pytest.approx(-math.log(2) / 2, rel=1e-7)
    assert m["log_ppl_abs_diff"] == pytest.approx(math.log(2) / 2, rel=1e-7)
    assert m["ppl_ratio"] == pytest.approx(math.sqrt(8) / 4, rel=1e-7)
    assert m["chi2_token"] == pytest.approx((4 + 1) / 2 - 1, rel=1e-7)  # E[ρ²] − 1
    assert m["chi2_seq"] == pytest.approx(4 - 1, rel=1e-7)  # (2·1)² − 1
    only_training = offpolicy_metrics(train, None, torch.ones(1, 2, dtype=F64))
    assert set(only_training) == {"training_ppl", "training_log_ppl"}


def test_offpolicy_metrics_match_plain_loop_over_rows():
    gen = torch.Generator().manual_seed(3)
    train = -torch.rand(5, 4, generator=gen, dtype=F64) * 3
    rollout = -torch.rand(5, 4, generator=gen, dtype=F64) * 3
    mask = (torch.rand(5, 4, generator=gen) > 0.3).to(F64)
    mask[0, 0] = 1
    m = offpolicy_metrics(train, rollout, mask)
    diffs, chi2_seq = [], []
    for i in range(5):
        idx = [t for t in range(4) if mask[i, t]]
        mean_train = sum(train[i, t].item() for t in idx) / (len(idx) + 1e-8)
        mean_roll = sum(rollout[i, t].item() for t in idx) / (len(idx) + 1e-8)
        diffs.append(mean_roll - mean_train)
        chi2_seq.append(math.exp(2 * sum(train[i, t].item() - rollout[i, t].item() for t in idx)))
    assert m["log_ppl_diff_max"] == pytest.approx(max(diffs), rel=1e-10)
    assert m["log_ppl_diff_min"] == pytest.approx(min(diffs), rel=1e-10)
    assert m["ppl_ratio"] == pytest.approx(sum(math.exp(d) for d in diffs) / 5, rel=1e-10)
    assert m["chi2_seq"] == pytest.approx(sum(chi2_seq) / 5 - 1, rel=1e-10)


def test_combined_call_prefixes_and_wires_the_parts():
    gen = torch.Generator().manual_seed(4)
    old = -torch.rand(4, 5, generator=gen, dtype=F64) * 2
    rollout = old + torch.randn(4, 5, generator=gen, dtype=F64) * 0.3
    mask = torch.ones(4, 5, dtype=F64)
    weights, new_mask, m = rollout_correction(
        old, rollout, mask, rollout_is="token", rollout_rs="token_k1", rollout_rs_threshold="0.8_1.25"
    )
    expected_weights, _ = rollout_is_weights(old - rollout, mask)
    expected_mask, _ = rejection_mask(old - rollout, mask, "token_k1", "0.8_1.25")
    torch.testing.assert_close(weights, expected_weights)
    torch.testing.assert_close(new_mask, expected_mask)
    assert all(name.startswith("rollout_corr/") for name in m)
    assert {
        "rollout_corr/rollout_is_mean",
        "rollout_corr/rollout_rs_masked_fraction",
        "rollout_corr/chi2_seq",
    } <= set(m)
    assert m == pytest.approx({**m, **rollout_corr_metrics(old, rollout, mask)})  # same diagnostics
    none_weights, same_mask, only_diag = rollout_correction(old, rollout, mask)
    assert none_weights is None and torch.equal(same_mask, mask) and same_mask is not mask
    assert not any("rollout_is" in k or "rollout_rs" in k for k in only_diag)
    with pytest.raises(ValueError, match="valid token"):
        rollout_correction(old, rollout, torch.zeros_like(mask))


def test_diagnostics_count_empty_rows_like_verl():
    train = torch.tensor([[math.log(0.5), 0.0], [0.0, 0.0]], dtype=F64)
    mask = torch.tensor([[1, 0], [0, 0]], dtype=F64)
    m = offpolicy_metrics(train, None, mask)
    # row ppl: 2 and exp(0) = 1 for the empty row; verl averages over every row → 1.5
    assert m["training_ppl"] == pytest.approx(1.5, rel=1e-7)
    assert masked_mean(train, mask).item() == pytest.approx(math.log(0.5), rel=1e-7)
