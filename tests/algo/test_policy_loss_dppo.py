"""DPPO-Binary-TV and -KL: which tokens the trust region keeps, the truncated weight, and the gradient."""

from __future__ import annotations

import math

import pytest
import torch

from stratarl.algo.policy_loss.dppo import binary_kl, dppo_kl_loss, dppo_tv_loss

F64 = torch.float64


def _probs(prob, old_prob, advantages) -> dict:
    return {
        "log_prob": torch.tensor([prob], dtype=F64).log(),
        "old_log_prob": torch.tensor([old_prob], dtype=F64).log(),
        "advantages": torch.tensor([advantages], dtype=F64),
        "response_mask": torch.ones(1, len(prob)),
    }


def test_tv_trust_region_hand_computed() -> None:
    # p − p_old = [+0.3, +0.3, −0.3, −0.3, +0.1] with A = [+, −, −, +, +], δ = 0.2
    inputs = _probs([0.8, 0.8, 0.2, 0.2, 0.6], [0.5, 0.5, 0.5, 0.5, 0.5], [1.0, -1.0, -1.0, 1.0, 2.0])
    out = dppo_tv_loss(**inputs, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0)
    # kept: A>0 needs Δp ≤ 0.2 → tokens 3 (−0.3), 4 (+0.1); A≤0 needs Δp ≥ −0.2 → token 1 (+0.3)
    keep = torch.tensor([[0.0, 1.0, 0.0, 1.0, 1.0]], dtype=F64)
    ratio = torch.tensor([[1.6, 1.6, 0.4, 0.4, 1.2]], dtype=F64)
    expected = -inputs["advantages"] * ratio * inputs["log_prob"] * keep
    torch.testing.assert_close(out.per_token_loss, expected)
    assert out.metrics["pg_clipfrac"].item() == pytest.approx(2 / 5)  # dropped share
    assert out.metrics["pg_clipfrac_lower"].item() == 0.0  # no kept ratio above c = 3


def test_tv_truncates_the_importance_weight_at_c() -> None:
    inputs = _probs([0.5, 0.5], [0.1, 0.1], [-1.0, -1.0])  # r = 5, Δp = +0.4 ≥ −0.2: kept (A < 0)
    out = dppo_tv_loss(**inputs, clip_ratio_c=3.0)
    # ℓ = −A·min(5, 3)·log 0.5 = 3·log 0.5
    torch.testing.assert_close(out.per_token_loss, torch.full((1, 2), 3 * math.log(0.5), dtype=F64))
    assert out.metrics["pg_clipfrac_lower"].item() == 1.0  # both kept and truncated


def test_binary_kl_hand_computed() -> None:
    p, q = 0.3, 0.6  # KL((q, 1 − q) ‖ (p, 1 − p)) = q·log(q/p) + (1 − q)·log((1 − q)/(1 − p))
    expected = q * math.log(q / p) + (1 - q) * math.log((1 - q + 1e-8) / (1 - p + 1e-8))
    got = binary_kl(torch.tensor(math.log(p), dtype=F64), torch.tensor(math.log(q), dtype=F64))
    assert got.item() == pytest.approx(expected, rel=1e-12)


def test_kl_trust_region_keeps_safe_moves_whatever_the_divergence() -> None:
    # p_old = 0.5; p = 0.9 and p = 0.1 both have binary KL ½·log 5 + ½·log(5/9) ≈ 0.511; δ = 0.05
    inputs = _probs([0.9, 0.9, 0.1, 0.1, 0.52], [0.5] * 5, [1.0, -1.0, 1.0, -1.0, 1.0])
    out = dppo_kl_loss(**inputs, clip_ratio_low=0.05, clip_ratio_high=0.05, clip_ratio_c=100.0)
    # A>0, p up by a lot: dropped. A<0, p up: safe, kept. A>0, p down: safe, kept.
    # A<0, p down by a lot: dropped. A>0, p up a little (KL ≈ 8e−4 ≤ 0.05): kept.
    kept = (out.per_token_loss != 0).to(F64)
    torch.testing.assert_close(kept, torch.tensor([[0.0, 1.0, 1.0, 0.0, 1.0]], dtype=F64))
    assert out.metrics["pg_clipfrac"].item() == pytest.approx(2 / 5)


@pytest.mark.parametrize("loss_fn", [dppo_tv_loss, dppo_kl_loss])
def test_gradient_is_truncated_weight_times_score_on_kept_tokens(loss_fn) -> None:
    gen = torch.Generator().manual_seed(0)
    old = torch.rand(5, 6, generator=gen, dtype=F64).clamp(0.05, 0.95).log()
    log_prob = (old + torch.randn(5, 6, generator=gen, dtype=F64) * 0.6).clamp(max=-1e-3)
    advantages = torch.randn(5, 6, generator=gen, dtype=F64)
    leaf = log_prob.clone().requires_grad_(True)
    out = loss_fn(
        log_prob=leaf,
        old_log_prob=old,
        advantages=advantages,
        response_mask=torch.ones(5, 6),
        clip_ratio_low=0.1,
        clip_ratio_high=0.1,
        clip_ratio_c=1.5,
    )
    (grad,) = torch.autograd.grad(out.per_token_loss.sum(), leaf)
    kept = out.per_token_loss != 0
    assert 0 < int(kept.sum()) < kept.numel()  # both kept and dropped tokens are exercised
    truncated = torch.exp(log_prob - old).clamp(max=1.5)
    # ∂ℓ/∂log π = −A·sg(min(r, c)) on kept tokens (no term from the ratio), 0 on dropped ones
    expected = torch.where(kept, -advantages * truncated, torch.zeros_like(advantages))
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("loss_fn", [dppo_tv_loss, dppo_kl_loss])
def test_ratio_one_and_zero_advantage(loss_fn) -> None:
    inputs = _probs([0.3, 0.7], [0.3, 0.7], [0.0, 2.0])
    out = loss_fn(**inputs)
    # p = p_old: every token kept, r = 1: ℓ = −A·log π = [0, −2·log 0.7]
    torch.testing.assert_close(out.per_token_loss, torch.tensor([[0.0, -2 * math.log(0.7)]], dtype=F64))
    assert out.metrics["pg_clipfrac"].item() == 0.0
    assert out.metrics["ppo_kl"].item() == 0.0
