"""SAPO's soft gate: hand-computed values, a plain-loop reference, its slope at r = 1, forced aggregation."""

from __future__ import annotations

import math

import pytest
import torch

from stratarl.algo.aggregation import aggregate_loss
from stratarl.algo.policy_loss import compute_policy_loss, get_policy_loss
from stratarl.algo.policy_loss.soft_gate import sapo_gate, sapo_loss

F64 = torch.float64


def _inputs(log_ratios, advantages, mask=None) -> dict:
    old = torch.full((len(log_ratios), len(log_ratios[0])), -1.5, dtype=F64)
    return {
        "log_prob": old + torch.tensor(log_ratios, dtype=F64),
        "old_log_prob": old,
        "advantages": torch.tensor(advantages, dtype=F64),
        "response_mask": torch.ones_like(old) if mask is None else torch.tensor(mask),
    }


def test_hand_computed_gate_at_ratio_one() -> None:
    out = sapo_loss(**_inputs([[0.0, 0.0, 0.0]], [[1.0, -1.0, 0.0]]), tau_pos=1.0, tau_neg=1.05)
    # r = 1: f = σ(0)·4/τ = 2/τ. A=+1 (τ_pos=1): ℓ = −2. A=−1 (τ_neg=1.05): ℓ = +2/1.05. A=0: ℓ = 0
    torch.testing.assert_close(out.per_token_loss, torch.tensor([[-2.0, 2.0 / 1.05, 0.0]], dtype=F64))
    assert out.metrics["pg_clipfrac"].item() == 0.0
    assert out.metrics["pg_clipfrac_lower"].item() == 0.0
    assert out.metrics["ppo_kl"].item() == 0.0


def test_hand_computed_gate_away_from_one() -> None:
    out = sapo_loss(**_inputs([[math.log(2.0)]], [[0.5]]), tau_pos=2.0)
    # r = 2, τ = 2: f = σ(2·1)·4/2 = 2σ(2); ℓ = −0.5·2σ(2) = −σ(2)
    assert out.per_token_loss.item() == pytest.approx(-1 / (1 + math.exp(-2.0)), rel=1e-12)


def test_gate_slope_at_ratio_one_is_one() -> None:
    ratio = torch.ones(3, dtype=F64, requires_grad=True)
    tau = torch.tensor([0.5, 1.0, 4.0], dtype=F64)
    (slope,) = torch.autograd.grad(sapo_gate(ratio, tau).sum(), ratio)
    # f'(r) = 4·σ'(τ(r − 1)) and σ'(0) = 1/4: the gate starts like the plain ratio
    torch.testing.assert_close(slope, torch.ones(3, dtype=F64))


def _loop_reference(log_prob, old_log_prob, advantages, tau_pos, tau_neg):
    rows = []
    for lp_row, old_row, adv_row in zip(
        log_prob.tolist(), old_log_prob.tolist(), advantages.tolist(), strict=True
    ):
        row = []
        for lp, old, a in zip(lp_row, old_row, adv_row, strict=True):
            r = math.exp(min(max(lp - old, -20.0), 20.0))
            tau = tau_pos if a > 0 else tau_neg
            row.append(-(4.0 / tau) / (1.0 + math.exp(-tau * (r - 1.0))) * a)
        rows.append(row)
    return torch.tensor(rows, dtype=F64)


@pytest.mark.parametrize(("tau_pos", "tau_neg"), [(1.0, 1.05), (0.5, 3.0)])
def test_vectorized_matches_plain_loop(tau_pos: float, tau_neg: float) -> None:
    gen = torch.Generator().manual_seed(2)
    old = -torch.rand(4, 6, generator=gen, dtype=F64) * 2
    log_prob = old + torch.randn(4, 6, generator=gen, dtype=F64)
    advantages = torch.randn(4, 6, generator=gen, dtype=F64)
    advantages[0, :2] = 0.0  # A = 0 takes tau_neg
    out = sapo_loss(
        log_prob=log_prob,
        old_log_prob=old,
        advantages=advantages,
        response_mask=torch.ones(4, 6),
        tau_pos=tau_pos,
        tau_neg=tau_neg,
    )
    expected = _loop_reference(log_prob, old, advantages, tau_pos, tau_neg)
    torch.testing.assert_close(out.per_token_loss, expected, rtol=1e-12, atol=1e-12)


def test_sapo_is_always_aggregated_by_sequence() -> None:
    inputs = _inputs(
        [[0.1, -0.2, 0.3], [0.2, 0.0, 0.0]], [[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]], [[1, 1, 1], [1, 0, 0]]
    )
    assert get_policy_loss("sapo").forced_aggregation == "seq-mean-token-mean"
    per_token = sapo_loss(**inputs).per_token_loss
    expected = aggregate_loss(per_token, inputs["response_mask"], "seq-mean-token-mean")
    for mode in ("token-mean", "token-sum", "seq-mean-token-sum"):
        loss, _ = compute_policy_loss("sapo", **inputs, loss_agg_mode=mode)
        assert loss.item() == pytest.approx(expected.item(), rel=1e-14)


def test_rollout_is_weights_multiply_the_per_token_loss() -> None:
    inputs = _inputs([[0.1, -0.2]], [[1.0, -1.0]])
    weights = torch.tensor([[0.5, 3.0]], dtype=F64)
    plain = sapo_loss(**inputs).per_token_loss
    torch.testing.assert_close(
        sapo_loss(**inputs, rollout_is_weights=weights).per_token_loss, plain * weights
    )
