"""GSPO and GMPO (geo_mean): hand-computed rows, a plain-loop GSPO, its stop-gradient, GMPO's reduction."""

from __future__ import annotations

import math

import pytest
import torch

from stratarl.algo.policy_loss import compute_policy_loss
from stratarl.algo.policy_loss.sequence_ratio import geo_mean_loss, gspo_loss

F64 = torch.float64


def _rows(log_ratios: list[list[float]], advantages: list[list[float]], mask: list[list[int]]) -> dict:
    old = torch.full((len(log_ratios), len(log_ratios[0])), -2.0, dtype=F64)
    return {
        "log_prob": old + torch.tensor(log_ratios, dtype=F64),
        "old_log_prob": old,
        "advantages": torch.tensor(advantages, dtype=F64),
        "response_mask": torch.tensor(mask),
    }


def test_gspo_hand_computed_rows() -> None:
    inputs = _rows([[0.1, 0.3], [-0.4, 5.0]], [[1.0, 1.0], [-1.0, -1.0]], [[1, 1], [1, 0]])
    out = gspo_loss(**inputs, clip_ratio_low=0.2, clip_ratio_high=0.3)
    # row 0: log s = (0.1 + 0.3) / 2 = 0.2, s = e^0.2 ≈ 1.221 < 1.3: ℓ = −e^0.2 on both tokens
    # row 1: log s = −0.4 (the masked 5.0 is ignored), s = e^−0.4 ≈ 0.670 < 0.8, A = −1:
    #        ℓ = max(0.670, 0.8) = 0.8, on the masked position too (it carries the row's ratio)
    expected = torch.tensor([[-math.exp(0.2), -math.exp(0.2)], [0.8, 0.8]], dtype=F64)
    torch.testing.assert_close(out.per_token_loss, expected)
    assert out.metrics["pg_clipfrac"].item() == pytest.approx(1 / 3)  # one of the three valid tokens
    assert out.metrics["pg_clipfrac_lower"].item() == 0.0
    assert out.metrics["ppo_kl"].item() == pytest.approx(-(0.1 + 0.3 - 0.4) / 3)


def _gspo_loop(log_prob, old_log_prob, advantages, mask, low, high):
    rows = []
    for lp, old, adv, m in zip(
        log_prob.tolist(), old_log_prob.tolist(), advantages.tolist(), mask.tolist(), strict=True
    ):
        length = max(sum(m), 1)
        log_s = sum((a - b) * w for a, b, w in zip(lp, old, m, strict=True)) / length
        s = math.exp(min(log_s, 10.0))
        rows.append([max(-a * s, -a * min(max(s, 1 - low), 1 + high)) for a in adv])
    return torch.tensor(rows, dtype=F64)


def _random_inputs(seed: int = 0, n: int = 5, t: int = 7) -> dict:
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, t, generator=gen, dtype=F64) * 3
    lengths = torch.tensor([7, 3, 0, 5, 1])[:n]
    return {
        "log_prob": old + torch.randn(n, t, generator=gen, dtype=F64) * 0.3,
        "old_log_prob": old,
        "advantages": torch.randn(n, 1, generator=gen, dtype=F64).expand(n, t).clone(),
        "response_mask": (torch.arange(t)[None, :] < lengths[:, None]).long(),
    }


@pytest.mark.parametrize(("low", "high"), [(3e-4, 4e-4), (0.05, 0.1), (0.2, 0.2)])
def test_gspo_vectorized_matches_plain_loop(low: float, high: float) -> None:
    inputs = _random_inputs()
    out = gspo_loss(**inputs, clip_ratio_low=low, clip_ratio_high=high)
    expected = _gspo_loop(*inputs.values(), low, high)
    torch.testing.assert_close(out.per_token_loss, expected, rtol=1e-12, atol=1e-12)


def test_gspo_gradient_is_the_sequence_ratio_token_by_token() -> None:
    inputs = _random_inputs(seed=3)
    log_prob = inputs.pop("log_prob").requires_grad_(True)
    low, high = 0.05, 0.1

    def loss_of(lp: torch.Tensor) -> torch.Tensor:
        return gspo_loss(log_prob=lp, **inputs, clip_ratio_low=low, clip_ratio_high=high).per_token_loss

    jacobian = torch.autograd.functional.jacobian(loss_of, log_prob)  # [N, T, N, T]
    n, t = log_prob.shape
    mask = inputs["response_mask"].to(F64)
    s = torch.exp((log_prob.detach() - inputs["old_log_prob"]).mul(mask).sum(-1) / mask.sum(-1).clamp(min=1))
    adv = inputs["advantages"]
    s_tok = s[:, None].expand(n, t)
    clip_binds = (-adv * s_tok.clamp(1 - low, 1 + high)) > (-adv * s_tok)
    expected_diag = torch.where(clip_binds, torch.zeros_like(adv), -adv * s_tok)
    # ∂ℓ_it/∂log π_it = −A·s_i unless the clip binds; nothing flows to other tokens (stop-gradient)
    diagonal = jacobian.reshape(n * t, n * t).diagonal().reshape(n, t)
    torch.testing.assert_close(diagonal, expected_diag, rtol=1e-12, atol=1e-12)
    off_diagonal = jacobian.reshape(n * t, n * t) - torch.diag(diagonal.reshape(-1))
    assert torch.count_nonzero(off_diagonal) == 0


def test_gspo_log_ratio_is_capped_at_10() -> None:
    inputs = _rows([[12.0, 12.0]], [[-1.0, -1.0]], [[1, 1]])
    out = gspo_loss(**inputs, clip_ratio_low=0.2, clip_ratio_high=0.2)
    # A < 0: max(−A·s, −A·clip(s)) = s = e^10 (capped from e^12); GSPO has no dual clip
    torch.testing.assert_close(out.per_token_loss, torch.full((1, 2), math.exp(10.0), dtype=F64))


def test_gspo_degenerate_rows() -> None:
    # an all-masked row has s = exp(0 / 1) = 1; zero advantages give zero loss
    inputs = _rows([[0.5, -0.5], [0.3, 0.3]], [[2.0, 2.0], [0.0, 0.0]], [[0, 0], [1, 1]])
    out = gspo_loss(**inputs)
    torch.testing.assert_close(out.per_token_loss, torch.tensor([[-2.0, -2.0], [0.0, 0.0]], dtype=F64))


def test_geo_mean_hand_computed_rows_and_reduction() -> None:
    inputs = _rows(
        [[0.5, -0.1], [-0.5, 0.1], [0.9, 0.9]],
        [[1.0, 1.0], [-1.0, -1.0], [3.0, 3.0]],
        [[1, 1], [1, 1], [0, 0]],
    )
    out = geo_mean_loss(**inputs, clip_ratio_low=0.2, clip_ratio_high=0.2)
    # row 0, A>0: log r̃ = [min(0.5, 0.2), min(−0.1, −0.1)] = [0.2, −0.1]; ρ = e^0.05; L = −e^0.05
    # row 1, A<0: log r̃ = −[min(0.5, 0.2), min(−0.1, −0.1)] = [−0.2, 0.1]; ρ = e^−0.05; L = +e^−0.05
    # row 2 is all-masked: Ā = 0, L = 0. Each L is spread evenly over its valid tokens.
    l0, l1 = -math.exp(0.05 * (2 / (2 + 1e-8))), math.exp(-0.05 * (2 / (2 + 1e-8)))
    l0, l1 = l0 * 2 / (2 + 1e-8), l1 * 2 / (2 + 1e-8)  # Ā = ΣA / (2 + 1e-8)
    expected = torch.tensor([[l0 / 2, l0 / 2], [l1 / 2, l1 / 2], [0.0, 0.0]], dtype=F64)
    torch.testing.assert_close(out.per_token_loss, expected, rtol=1e-12, atol=1e-12)
    assert out.metrics["pg_clipfrac"].item() == pytest.approx(1 / 4)  # row 0 token 0 (A > 0)
    assert out.metrics["pg_clipfrac_lower"].item() == pytest.approx(1 / 4)  # row 1 token 0 (A < 0)

    # verl: mean over all 3 rows, whatever loss_agg_mode and the normalizers say
    for mode in ("token-mean", "seq-mean-token-mean", "token-sum"):
        loss, _ = compute_policy_loss(
            "geo_mean", **inputs, loss_agg_mode=mode, dp_size=4, global_num_tokens=999, global_batch_size=99
        )
        assert loss.item() == pytest.approx((l0 + l1 + 0.0) / 3, rel=1e-12)


def test_geo_mean_weights_are_reduced_by_geometric_mean() -> None:
    inputs = _rows([[0.0, 0.0, 0.0]], [[1.0, 1.0, 1.0]], [[1, 1, 0]])
    weights = torch.tensor([[4.0, 0.25, 100.0]], dtype=F64)  # the masked 100 is ignored
    out = geo_mean_loss(**inputs, rollout_is_weights=weights)
    # w = exp((log 4 + log 0.25) / 2) = 1, so the loss is unchanged: L = −1, −0.5 per valid token
    torch.testing.assert_close(
        out.per_token_loss, torch.tensor([[-0.5, -0.5, 0.0]], dtype=F64), rtol=1e-8, atol=1e-8
    )
    doubled = geo_mean_loss(**inputs, rollout_is_weights=torch.full((1, 3), 2.0, dtype=F64))
    torch.testing.assert_close(doubled.per_token_loss.sum(), torch.tensor(-2.0, dtype=F64))


def test_geo_mean_gradient_reaches_every_unclipped_token_of_the_sequence() -> None:
    inputs = _rows([[0.5, -0.1]], [[1.0, 1.0]], [[1, 1]])
    log_prob = inputs.pop("log_prob").requires_grad_(True)
    out = geo_mean_loss(log_prob=log_prob, **inputs, clip_ratio_low=0.2, clip_ratio_high=0.2)
    (grad,) = torch.autograd.grad(out.per_token_loss.sum(), log_prob)
    # L = −Ā·exp(mean log r̃); token 0 is clipped (no gradient), token 1: −Ā·ρ·½
    rho = math.exp(0.05 * 2 / (2 + 1e-8))
    abar = 2 / (2 + 1e-8)
    expected = torch.tensor([[0.0, -abar * rho / (2 + 1e-8)]], dtype=F64)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-12)
