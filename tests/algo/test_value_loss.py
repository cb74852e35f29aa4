"""Checks the clipped value loss (hand values, gradients, a plain loop, verl's ½·agg composition under
every aggregation, padding invariance) and the explained variance of the critic."""

import math

import pytest
import torch

from stratarl.algo.aggregation import LOSS_AGGREGATIONS, aggregate_loss
from stratarl.algo.value_loss import clipped_value_loss, explained_variance

# c = 0.5
# token 0: v_clip = clip(2.0, 0.5, 1.5) = 1.5; (2 − 3)² = 1 < (1.5 − 3)² = 2.25 → ℓ = 1.125, clipped
# token 1: v_clip = clip(0.0, 0.0, 1.0) = 0.0; (0 − 1)² = 1 = (0 − 1)²          → ℓ = 0.5, not clipped
# token 2: v_clip = clip(1.8, 0.5, 1.5) = 1.5; (1.8 − 1.6)² = 0.04 > (1.5 − 1.6)² = 0.01 → ℓ = 0.02
VPREDS = torch.tensor([[2.0, 0.0, 1.8]], dtype=torch.float64)
VALUES = torch.tensor([[1.0, 0.5, 1.0]], dtype=torch.float64)
RETURNS = torch.tensor([[3.0, 1.0, 1.6]], dtype=torch.float64)
MASK = torch.ones(1, 3)


def test_hand_computed_loss_and_clipfrac():
    loss, metrics = clipped_value_loss(VPREDS, RETURNS, VALUES, MASK, cliprange_value=0.5)
    torch.testing.assert_close(loss, torch.tensor([[1.125, 0.5, 0.02]], dtype=torch.float64))
    assert metrics["vf_clipfrac"].item() == pytest.approx(1 / 3, rel=1e-6)  # only token 0
    # token-mean: (1.125 + 0.5 + 0.02) / 3 = 0.548333…
    assert aggregate_loss(loss, MASK, "token-mean").item() == pytest.approx(1.645 / 3, rel=1e-12)


def test_gradient_is_zero_where_the_clipped_branch_wins():
    vpreds = torch.tensor([[2.0, 0.8, 1.8]], dtype=torch.float64, requires_grad=True)
    loss, _ = clipped_value_loss(vpreds, RETURNS, VALUES, MASK, cliprange_value=0.5)
    (grad,) = torch.autograd.grad(loss.sum(), vpreds)
    # token 0: ℓ = ½(v_clip − R)², v_clip is the constant bound 1.5 → 0.
    # token 1: 0.8 is inside [0, 1], both branches are ½(v − R)² → v − R = −0.2.
    # token 2: the unclipped branch wins, ℓ = ½(v − R)² → v − R = 0.2.
    torch.testing.assert_close(grad, torch.tensor([[0.0, -0.2, 0.2]], dtype=torch.float64))


def test_matches_plain_loop():
    gen = torch.Generator().manual_seed(0)
    vpreds, values, returns = (torch.randn(4, 6, generator=gen, dtype=torch.float64) for _ in range(3))
    mask = (torch.rand(4, 6, generator=gen) > 0.3).to(torch.float64)
    loss, metrics = clipped_value_loss(vpreds, returns, values, mask, cliprange_value=0.2)
    clipped, count = 0, 0
    for i in range(4):
        for t in range(6):
            v, old, ret = vpreds[i, t].item(), values[i, t].item(), returns[i, t].item()
            v_clip = min(max(v, old - 0.2), old + 0.2)
            assert loss[i, t].item() == pytest.approx(
                0.5 * max((v - ret) ** 2, (v_clip - ret) ** 2), abs=1e-12
            )
            if mask[i, t]:
                count += 1
                clipped += (v_clip - ret) ** 2 > (v - ret) ** 2
    assert metrics["vf_clipfrac"].item() == pytest.approx(clipped / (count + 1e-8), rel=1e-6)


@pytest.mark.parametrize("mode", sorted(LOSS_AGGREGATIONS))
def test_aggregating_the_per_token_loss_equals_verls_half_of_aggregated_max(mode):
    gen = torch.Generator().manual_seed(1)
    vpreds, values, returns = (torch.randn(5, 7, generator=gen) for _ in range(3))
    mask = (torch.rand(5, 7, generator=gen) > 0.4).float()
    loss, _ = clipped_value_loss(vpreds, returns, values, mask, cliprange_value=0.3)
    # verl: 0.5 * agg_loss(max(l1, l2)); ×½ is exact in floating point, so the results are identical.
    v_clip = torch.max(torch.min(vpreds, values + 0.3), values - 0.3)
    unhalved = torch.max((vpreds - returns) ** 2, (v_clip - returns) ** 2)
    assert aggregate_loss(loss, mask, mode).item() == 0.5 * aggregate_loss(unhalved, mask, mode).item()


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_padding_changes_neither_loss_nor_clipfrac(mode):
    gen = torch.Generator().manual_seed(2)
    vpreds, values, returns = (torch.randn(3, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.float64)
    loss, metrics = clipped_value_loss(vpreds, returns, values, mask)
    garbage = torch.full((3, 5), float("nan"), dtype=torch.float64)
    padded = [torch.cat([x, garbage], dim=1) for x in (vpreds, returns, values)]
    padded_mask = torch.cat([mask, torch.zeros(3, 5, dtype=torch.float64)], dim=1)
    padded_loss, padded_metrics = clipped_value_loss(*padded, padded_mask)
    torch.testing.assert_close(
        aggregate_loss(padded_loss, padded_mask, mode), aggregate_loss(loss, mask, mode)
    )
    torch.testing.assert_close(padded_metrics["vf_clipfrac"], metrics["vf_clipfrac"])


def test_empty_mask_and_shape_errors():
    loss, metrics = clipped_value_loss(VPREDS, RETURNS, VALUES, torch.zeros(1, 3))
    assert metrics["vf_clipfrac"].item() == 0.0  # 0 / (0 + 1e-8)
    assert aggregate_loss(loss, torch.zeros(1, 3), "token-mean").item() == 0.0
    with pytest.raises(ValueError, match="values"):
        clipped_value_loss(VPREDS, RETURNS, VALUES[:, :2], MASK)


def test_explained_variance_hand_computed():
    returns = torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=torch.float64)
    mask = torch.ones(1, 4)
    # perfect prediction: Var(R − V) = 0 → 1
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    # a constant offset is also explained: R − V = −1 everywhere → Var 0 → 1
    assert explained_variance(returns, returns + 1.0, mask) == pytest.approx(1.0)
    # V = mean(R) = 2.5: Var(R − V) = Var(R) = 5/3 (unbiased) → 1 − (5/3)/(5/3 + 1e-5) = 1e-5/(5/3 + 1e-5)
    constant = torch.full_like(returns, 2.5)
    assert explained_variance(returns, constant, mask) == pytest.approx(1e-5 / (5 / 3 + 1e-5), rel=1e-9)
    # V = R with the sign of the deviations flipped: R − V = 2(R − 2.5), Var = 4·5/3 → 1 − 4 ≈ −3
    flipped = 5.0 - returns
    assert explained_variance(returns, flipped, mask) == pytest.approx(
        1 - (20 / 3) / (5 / 3 + 1e-5), rel=1e-9
    )


def test_explained_variance_ignores_padding_and_matches_a_loop():
    gen = torch.Generator().manual_seed(3)
    returns, values = (
        torch.randn(4, 5, generator=gen, dtype=torch.float64),
        torch.randn(4, 5, dtype=torch.float64),
    )
    mask = (torch.rand(4, 5, generator=gen) > 0.3).long()
    pairs = [(returns[i, t].item(), values[i, t].item()) for i in range(4) for t in range(5) if mask[i, t]]
    r = [p[0] for p in pairs]
    d = [p[0] - p[1] for p in pairs]

    def unbiased_var(xs):
        mean = sum(xs) / len(xs)
        return sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)

    expected = 1 - unbiased_var(d) / (unbiased_var(r) + 1e-5)
    assert explained_variance(returns, values, mask) == pytest.approx(expected, rel=1e-10)
    noisy = torch.where(mask.bool(), values, torch.full_like(values, float("nan")))
    assert explained_variance(returns, noisy, mask) == pytest.approx(expected, rel=1e-10)


def test_explained_variance_degenerate_is_nan():
    one = torch.tensor([[1.0, 2.0]])
    assert math.isnan(explained_variance(one, one, torch.tensor([[1, 0]])))
    assert math.isnan(explained_variance(one, one, torch.zeros(1, 2)))
