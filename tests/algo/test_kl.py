"""Checks the per-token KL estimators: hand values, verl's k3 clamps, straight-through gradients, exact
expectations over a small vocabulary, and the registry's errors."""

import math

import pytest
import torch

from stratarl.algo.kl import KL_ESTIMATORS, get_kl_estimator, kl_penalty

# Δ = log π − log π_ref = [1, 0, −1.5]
LOG_PROB = torch.tensor([[0.0, -1.0, -2.0]], dtype=torch.float64)
REF_LOG_PROB = torch.tensor([[-1.0, -1.0, -0.5]], dtype=torch.float64)


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("k1", [1.0, 0.0, -1.5]),  # Δ
        ("kl", [1.0, 0.0, -1.5]),
        ("abs", [1.0, 0.0, 1.5]),  # |Δ|
        ("k2", [0.5, 0.0, 1.125]),  # ½Δ²: ½·1, 0, ½·2.25
        ("mse", [0.5, 0.0, 1.125]),
        # exp(−Δ) + Δ − 1: e^−1 + 1 − 1 = 0.3678794412, 0, e^1.5 − 1.5 − 1 = 4.4816890703 − 2.5
        ("k3", [math.exp(-1.0), 0.0, math.exp(1.5) - 2.5]),
        ("low_var_kl", [math.exp(-1.0), 0.0, math.exp(1.5) - 2.5]),
    ],
)
def test_hand_computed_values(kind, expected):
    got = kl_penalty(LOG_PROB, REF_LOG_PROB, kind)
    torch.testing.assert_close(got, torch.tensor([expected], dtype=torch.float64), rtol=0, atol=1e-12)


def test_k3_clamps_like_verl():
    # Δ = −30: −Δ = 30 is clamped to 20, exp(20) − 20 − 1 ≈ 4.85e8, clamped to 10.
    # Δ = 25: −Δ = −25 is clamped to −20, exp(−20) + 20 − 1 ≈ 19.000000002, clamped to 10.
    # Δ = −3: exp(3) − 3 − 1 = 16.0855, clamped to 10.  Δ = −2: exp(2) − 3 = 4.3891 (no clamp).
    log_prob = torch.tensor([-30.0, 25.0, -3.0, -2.0], dtype=torch.float64, requires_grad=True)
    ref = torch.zeros(4, dtype=torch.float64)
    value = kl_penalty(log_prob, ref, "k3")
    torch.testing.assert_close(
        value.detach(), torch.tensor([10.0, 10.0, 10.0, math.exp(2.0) - 3.0], dtype=torch.float64)
    )
    # A binding clamp stops the gradient; otherwise d/dΔ (exp(−Δ) + Δ − 1) = 1 − exp(−Δ).
    (grad,) = torch.autograd.grad(value.sum(), log_prob)
    torch.testing.assert_close(grad, torch.tensor([0.0, 0.0, 0.0, 1.0 - math.exp(2.0)], dtype=torch.float64))


def test_k3_matches_plain_loop():
    gen = torch.Generator().manual_seed(0)
    log_prob = torch.randn(4, 7, generator=gen, dtype=torch.float64) * 3
    ref = torch.randn(4, 7, generator=gen, dtype=torch.float64) * 3
    got = kl_penalty(log_prob, ref, "low_var_kl")
    for i in range(4):
        for t in range(7):
            neg_delta = min(max(ref[i, t].item() - log_prob[i, t].item(), -20.0), 20.0)
            expected = min(max(math.exp(neg_delta) - neg_delta - 1.0, -10.0), 10.0)
            assert got[i, t].item() == pytest.approx(expected, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("base", ["k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl"])
def test_straight_through_value_of_base_gradient_of_k2(base):
    gen = torch.Generator().manual_seed(1)
    log_prob = (torch.randn(3, 5, generator=gen, dtype=torch.float64) * 2).requires_grad_()
    ref = (torch.randn(3, 5, generator=gen, dtype=torch.float64) * 2).requires_grad_()
    upstream = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    value = kl_penalty(log_prob, ref, base + "+")
    torch.testing.assert_close(value.detach(), kl_penalty(log_prob, ref, base).detach(), rtol=0, atol=0)
    grad_lp, grad_ref = torch.autograd.grad((value * upstream).sum(), (log_prob, ref))
    delta = (log_prob - ref).detach()
    # ∂(½Δ²)/∂log π = Δ and ∂(½Δ²)/∂log π_ref = −Δ, whatever the base estimator.
    torch.testing.assert_close(grad_lp, delta * upstream, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad_ref, -delta * upstream, rtol=1e-12, atol=1e-12)


def test_plain_k1_and_k3_gradients_are_not_k2s():
    # The reason the '+' variants exist: without them the gradient is the base estimator's own.
    log_prob = torch.tensor([0.5], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([0.0], dtype=torch.float64)
    (g1,) = torch.autograd.grad(kl_penalty(log_prob, ref, "k1").sum(), log_prob)
    (g3,) = torch.autograd.grad(kl_penalty(log_prob, ref, "k3").sum(), log_prob)
    assert g1.item() == pytest.approx(1.0)  # d Δ / dΔ
    assert g3.item() == pytest.approx(1.0 - math.exp(-0.5))  # 1 − exp(−Δ) = 0.3935, not Δ = 0.5


def test_k1_and_k3_are_unbiased_under_exact_expectation():
    # E_{x~π}[k1] = Σ π log(π/π_ref) = KL(π‖π_ref);  E_π[k3] = Σ π_ref − 1 + KL = KL.
    gen = torch.Generator().manual_seed(2)
    log_pi = torch.log_softmax(torch.randn(6, generator=gen, dtype=torch.float64), dim=0)
    log_ref = torch.log_softmax(torch.randn(6, generator=gen, dtype=torch.float64), dim=0)
    exact_kl = (log_pi.exp() * (log_pi - log_ref)).sum()
    for kind in ("k1", "k3"):
        expectation = (log_pi.exp() * kl_penalty(log_pi, log_ref, kind)).sum()
        torch.testing.assert_close(expectation, exact_kl, rtol=1e-12, atol=1e-12)
    # k2 is biased: E_π[½Δ²] differs from KL for these distributions.
    assert abs((log_pi.exp() * kl_penalty(log_pi, log_ref, "k2")).sum() - exact_kl) > 1e-3


def test_registry_names_and_errors():
    assert {"k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl", "k3+", "low_var_kl+", "k1+"} <= set(
        KL_ESTIMATORS
    )
    with pytest.raises(NotImplementedError, match="full"):
        get_kl_estimator("full")
    with pytest.raises(NotImplementedError, match="full"):
        kl_penalty(LOG_PROB, REF_LOG_PROB, "full+")
    with pytest.raises(ValueError, match="'low_var_kl'"):  # closest valid name is suggested
        get_kl_estimator("low_var_k")
    with pytest.raises(ValueError, match="must match"):
        kl_penalty(LOG_PROB, REF_LOG_PROB[:, :2], "k1")


def test_inputs_are_not_modified():
    log_prob, ref = LOG_PROB.clone(), REF_LOG_PROB.clone()
    for kind in KL_ESTIMATORS:
        kl_penalty(log_prob, ref, kind)
    assert torch.equal(log_prob, LOG_PROB) and torch.equal(ref, REF_LOG_PROB)
