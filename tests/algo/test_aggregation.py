"""Aggregation: hand-computed modes, a plain-loop reference, padding and k-rank invariance, empty masks."""

from __future__ import annotations

import pytest
import torch

from stratarl.algo.aggregation import LOSS_AGGREGATIONS, aggregate_loss, get_loss_aggregation

MODES = sorted(LOSS_AGGREGATIONS)
# seq-mean-token-sum-norm's default divisor is the padded width; invariances need it fixed.
FIXED_SCALE = 7.0

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 7.0 / 3.0),  # (1 + 2 + 4) / 3 valid tokens
        ("token-sum", 7.0),  # 1 + 2 + 4
        ("seq-mean-token-sum", 3.5),  # ((1 + 2) + 4) / 2 sequences
        # ((1 + 2) / (2 + 1e-8) + 4 / (1 + 1e-8)) / 2 ≈ (1.5 + 4) / 2
        ("seq-mean-token-mean", (3.0 / (2 + 1e-8) + 4.0 / (1 + 1e-8)) / 2),
        ("seq-mean-token-sum-norm", 3.5 / 3.0),  # seq-mean-token-sum / T, T = 3 columns
    ],
)
def test_hand_computed_modes(mode: str, expected: float) -> None:
    assert aggregate_loss(LOSS, MASK, mode).item() == pytest.approx(expected, rel=1e-12)


def test_hand_computed_global_normalizers() -> None:
    # token-mean: 7 / 14 global tokens · 2 ranks = 1.0
    assert aggregate_loss(LOSS, MASK, "token-mean", dp_size=2, global_num_tokens=14).item() == 1.0
    # token-sum: 7 · 2 ranks = 14
    assert aggregate_loss(LOSS, MASK, "token-sum", dp_size=2).item() == 14.0
    # seq-mean-token-sum: 7 / 4 global sequences · 2 ranks = 3.5
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-sum", dp_size=2, global_batch_size=4).item() == 3.5
    # seq-mean-token-sum-norm (0.9.1): 7 / 4 · 2 / 7 = 0.5
    got = aggregate_loss(
        LOSS, MASK, "seq-mean-token-sum-norm", dp_size=2, global_batch_size=4, loss_scale_factor=7
    )
    assert got.item() == 0.5


def test_fully_masked_row_counts_in_no_sequence_mean() -> None:
    loss = torch.cat([LOSS, torch.full((1, 3), 100.0, dtype=torch.float64)])
    mask = torch.cat([MASK, torch.zeros(1, 3, dtype=MASK.dtype)])
    for mode in MODES:
        assert aggregate_loss(loss, mask, mode).item() == pytest.approx(
            aggregate_loss(LOSS, MASK, mode).item(), rel=1e-12
        )


def test_values_outside_the_mask_never_reach_the_result() -> None:
    poisoned = LOSS.clone()
    poisoned[MASK == 0] = float("nan")
    for mode in MODES:
        assert aggregate_loss(poisoned, MASK, mode).item() == aggregate_loss(LOSS, MASK, mode).item()


@pytest.mark.parametrize("mode", MODES)
def test_mask_dtypes_agree(mode: str) -> None:
    expected = aggregate_loss(LOSS, MASK, mode)
    for mask in (MASK.bool(), MASK.float(), MASK.double()):
        assert aggregate_loss(LOSS, mask, mode).item() == pytest.approx(expected.item(), rel=1e-12)


def _loop_reference(loss: torch.Tensor, mask: torch.Tensor, mode: str, scale: float) -> float:
    """Each mode written as plain Python over rows and tokens."""
    rows = [
        [float(v) for v, m in zip(loss_row, mask_row, strict=True) if m]
        for loss_row, mask_row in zip(loss.tolist(), mask.tolist(), strict=True)
    ]
    non_empty = [row for row in rows if row]
    total = sum(sum(row) for row in rows)
    if mode == "token-mean":
        return total / sum(len(row) for row in rows)
    if mode == "token-sum":
        return total
    if mode == "seq-mean-token-sum":
        return sum(sum(row) for row in non_empty) / len(non_empty)
    if mode == "seq-mean-token-mean":
        return sum(sum(row) / (len(row) + 1e-8) for row in non_empty) / len(non_empty)
    return sum(sum(row) for row in non_empty) / len(non_empty) / scale  # seq-mean-token-sum-norm


@pytest.mark.parametrize("mode", MODES)
def test_vectorized_matches_plain_loop(mode: str) -> None:
    gen = torch.Generator().manual_seed(1)
    loss = torch.randn(7, 5, generator=gen, dtype=torch.float64)
    mask = (torch.rand(7, 5, generator=gen) > 0.4).long()
    mask[2] = 0  # an all-masked row
    mask[3, 0] = 1  # at least one valid token somewhere
    got = aggregate_loss(loss, mask, mode, loss_scale_factor=FIXED_SCALE)
    assert got.item() == pytest.approx(_loop_reference(loss, mask, mode, FIXED_SCALE), rel=1e-12)


def _batch(seed: int = 0, n: int = 7, t: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, t, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([6, 1, 0, 4, 6, 2, 3])[:n]  # row 2 is all-masked
    mask = (torch.arange(t)[None, :] < lengths[:, None]).long()
    return x, mask


def _per_token(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """A per-token loss depending on a parameter shared by all rows (as model weights are)."""
    return torch.sin(x * theta) + (x * theta).square()


@pytest.mark.parametrize("mode", MODES)
def test_right_padding_changes_neither_loss_nor_gradient(mode: str) -> None:
    x, mask = _batch()
    theta = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    loss = aggregate_loss(_per_token(x, theta), mask, mode, loss_scale_factor=FIXED_SCALE)
    (grad,) = torch.autograd.grad(loss, theta)

    garbage = torch.full((x.shape[0], 3), 1e6, dtype=torch.float64)
    x_pad = torch.cat([x, garbage], dim=1)
    mask_pad = torch.cat([mask, torch.zeros(x.shape[0], 3, dtype=mask.dtype)], dim=1)
    theta_pad = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    loss_pad = aggregate_loss(_per_token(x_pad, theta_pad), mask_pad, mode, loss_scale_factor=FIXED_SCALE)
    (grad_pad,) = torch.autograd.grad(loss_pad, theta_pad)

    torch.testing.assert_close(loss_pad, loss, rtol=1e-12, atol=0)
    torch.testing.assert_close(grad_pad, grad, rtol=1e-12, atol=0)


def test_default_norm_divisor_is_the_padded_width() -> None:
    # verl's default S = T: two extra padding columns scale the loss by T / (T + 2) = 3 / 5.
    padded = torch.cat([LOSS, torch.zeros(2, 2, dtype=LOSS.dtype)], dim=1)
    mask = torch.cat([MASK, torch.zeros(2, 2, dtype=MASK.dtype)], dim=1)
    got = aggregate_loss(padded, mask, "seq-mean-token-sum-norm").item()
    assert got == pytest.approx(aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm").item() * 3 / 5)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("splits", [(3, 4), (1, 2, 4), (2, 2, 2, 1)])
def test_split_over_ranks_gives_the_loss_and_gradient_of_the_whole_batch(mode: str, splits: tuple) -> None:
    x, mask = _batch()
    k = len(splits)
    normalizers = {
        "global_num_tokens": int(mask.sum()),
        "global_batch_size": x.shape[0],  # verl's ppo_mini_batch_size · n: all rows, empty ones too
        "loss_scale_factor": FIXED_SCALE,
    }
    theta = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    whole = aggregate_loss(_per_token(x, theta), mask, mode, dp_size=1, **normalizers)
    (whole_grad,) = torch.autograd.grad(whole, theta)

    rank_losses, rank_grads = [], []
    for x_r, mask_r in zip(x.split(list(splits)), mask.split(list(splits)), strict=True):
        theta_r = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)  # each rank's replica
        local = aggregate_loss(_per_token(x_r, theta_r), mask_r, mode, dp_size=k, **normalizers)
        rank_losses.append(local)
        rank_grads.append(torch.autograd.grad(local, theta_r)[0])

    # data parallelism averages gradients over ranks; the logged loss is the same average
    torch.testing.assert_close(torch.stack(rank_losses).mean(), whole, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(torch.stack(rank_grads).mean(), whole_grad, rtol=1e-12, atol=1e-14)


def test_local_default_counts_equal_explicit_counts_on_one_rank() -> None:
    x, mask = _batch()
    non_empty_rows = int((mask.sum(dim=-1) > 0).sum())  # 6: the default seq count skips the empty row
    assert aggregate_loss(x, mask, "token-mean").item() == pytest.approx(
        aggregate_loss(x, mask, "token-mean", global_num_tokens=int(mask.sum())).item(), rel=1e-14
    )
    for mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        assert aggregate_loss(x, mask, mode).item() == pytest.approx(
            aggregate_loss(x, mask, mode, global_batch_size=non_empty_rows).item(), rel=1e-14
        )


@pytest.mark.parametrize("mode", MODES)
def test_empty_mask_gives_zero_loss_and_zero_gradient(mode: str) -> None:
    theta = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    x = torch.randn(3, 4, dtype=torch.float64)
    loss = aggregate_loss(_per_token(x, theta), torch.zeros(3, 4), mode)
    (grad,) = torch.autograd.grad(loss, theta)
    assert loss.item() == 0.0  # verl 0.9.1: 0 / 0 = NaN for the mean modes
    assert grad.item() == 0.0


@pytest.mark.parametrize(
    ("mode", "argument"),
    [
        ("token-mean", "global_num_tokens"),
        ("seq-mean-token-sum", "global_batch_size"),
        ("seq-mean-token-mean", "global_batch_size"),
        ("seq-mean-token-sum-norm", "global_batch_size"),
    ],
)
def test_several_ranks_require_the_global_count(mode: str, argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        aggregate_loss(LOSS, MASK, mode, dp_size=2)


def test_token_sum_needs_no_global_count() -> None:
    assert aggregate_loss(LOSS, MASK, "token-sum", dp_size=3).item() == 21.0  # 7 · 3


def test_unknown_mode_names_the_valid_ones_and_the_closest() -> None:
    with pytest.raises(ValueError, match=r"Did you mean 'token-mean'\?") as error:
        get_loss_aggregation("token_mean")
    assert "seq-mean-token-sum-norm" in str(error.value)


def test_bad_shapes_are_rejected() -> None:
    with pytest.raises(ValueError, match="response_mask shape"):
        aggregate_loss(LOSS, MASK[:, :2], "token-mean")
    with pytest.raises(ValueError, match=r"\[N, T\]"):
        aggregate_loss(LOSS[0], MASK[0], "token-mean")
    with pytest.raises(ValueError, match="dp_size"):
        aggregate_loss(LOSS, MASK, "token-mean", dp_size=0)


def test_tensor_counts_behave_like_integers() -> None:
    as_int = aggregate_loss(LOSS, MASK, "token-mean", dp_size=2, global_num_tokens=14)
    as_tensor = aggregate_loss(LOSS, MASK, "token-mean", dp_size=2, global_num_tokens=torch.tensor(14))
    assert as_int.item() == as_tensor.item() == 1.0
