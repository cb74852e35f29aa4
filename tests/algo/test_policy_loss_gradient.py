"""GPG, CISPO, DRO, REINFORCE-IS: hand-computed values, a plain-loop CISPO, gradients by autograd."""

from __future__ import annotations

import math

import pytest
import torch

from stratarl.algo.policy_loss.gradient import cispo_loss, dro_loss, gpg_loss, reinforce_loss

F64 = torch.float64


def _inputs(log_prob, old_log_prob, advantages, mask=None) -> dict:
    log_prob = torch.tensor(log_prob, dtype=F64)
    return {
        "log_prob": log_prob,
        "old_log_prob": torch.tensor(old_log_prob, dtype=F64),
        "advantages": torch.tensor(advantages, dtype=F64),
        "response_mask": torch.ones_like(log_prob) if mask is None else torch.tensor(mask),
    }


def _grad(loss_fn, inputs: dict, **hyper) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-token loss, ∂Σℓ/∂log π, ∂Σℓ/∂log π_old) with both log-probs as leaves."""
    log_prob = inputs["log_prob"].clone().requires_grad_(True)
    old = inputs["old_log_prob"].clone().requires_grad_(True)
    out = loss_fn(**{**inputs, "log_prob": log_prob, "old_log_prob": old}, **hyper)
    grads = torch.autograd.grad(out.per_token_loss.sum(), (log_prob, old), allow_unused=True)
    return out, grads[0], grads[1]


def test_gpg_is_the_plain_score_function() -> None:
    inputs = _inputs([[-0.5, -2.0]], [[-9.0, 3.0]], [[2.0, -1.0]])
    out, grad, old_grad = _grad(gpg_loss, inputs)
    # ℓ = −A·log π = [−2·(−0.5), −(−1)·(−2)] = [1, −2]; ∂ℓ/∂log π = −A; old log-probs unused
    torch.testing.assert_close(out.per_token_loss, torch.tensor([[1.0, -2.0]], dtype=F64))
    torch.testing.assert_close(grad, torch.tensor([[-2.0, 1.0]], dtype=F64))
    assert old_grad is None
    assert out.metrics == {}


def test_cispo_hand_computed() -> None:
    # log r = [log 1.5, log 0.5, 0]; clip(r, 0.8, 1.2) = [1.2, 0.8, 1]
    inputs = _inputs(
        [[-0.5, -1.0, -2.0]], [[-0.5 - math.log(1.5), -1.0 - math.log(0.5), -2.0]], [[1.0, 2.0, -1.0]]
    )
    out = cispo_loss(**inputs)
    # ℓ = −sg(clip r)·A·log π = [−1.2·1·(−0.5), −0.8·2·(−1), −1·(−1)·(−2)] = [0.6, 1.6, −2]
    torch.testing.assert_close(out.per_token_loss, torch.tensor([[0.6, 1.6, -2.0]], dtype=F64))
    assert out.metrics["pg_clipfrac"].item() == pytest.approx(2 / 3)
    assert out.metrics["pg_clipfrac_lower"].item() == 0.0


def _cispo_loop(log_prob, old_log_prob, advantages, low, high):
    rows = []
    for lp_row, old_row, adv_row in zip(
        log_prob.tolist(), old_log_prob.tolist(), advantages.tolist(), strict=True
    ):
        rows.append(
            [
                -min(max(math.exp(min(max(lp - old, -20.0), 20.0)), 1 - low), 1 + high) * a * lp
                for lp, old, a in zip(lp_row, old_row, adv_row, strict=True)
            ]
        )
    return torch.tensor(rows, dtype=F64)


def _random(seed: int, n: int = 5, t: int = 7) -> dict:
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, t, generator=gen, dtype=F64) * 3
    return {
        "log_prob": old + torch.randn(n, t, generator=gen, dtype=F64) * 0.5,
        "old_log_prob": old,
        "advantages": torch.randn(n, t, generator=gen, dtype=F64),
        "response_mask": torch.ones(n, t),
    }


@pytest.mark.parametrize(("low", "high"), [(0.2, 0.2), (1.0, 4.0), (0.05, 0.28)])
def test_cispo_vectorized_matches_plain_loop(low: float, high: float) -> None:
    inputs = _random(seed=0)
    out = cispo_loss(**inputs, clip_ratio_low=low, clip_ratio_high=high)
    expected = _cispo_loop(inputs["log_prob"], inputs["old_log_prob"], inputs["advantages"], low, high)
    torch.testing.assert_close(out.per_token_loss, expected, rtol=1e-12, atol=1e-12)


def test_cispo_gradient_keeps_clipped_tokens_and_stops_at_the_weight() -> None:
    inputs = _random(seed=1)
    out, grad, old_grad = _grad(cispo_loss, inputs, clip_ratio_low=0.1, clip_ratio_high=0.1)
    ratio = torch.exp(inputs["log_prob"] - inputs["old_log_prob"])
    clipped_ratio = ratio.clamp(0.9, 1.1)
    assert out.metrics["pg_clipfrac"].item() > 0.3  # many tokens clipped, and still:
    torch.testing.assert_close(grad, -clipped_ratio * inputs["advantages"], rtol=1e-12, atol=1e-12)
    assert old_grad is None or torch.count_nonzero(old_grad) == 0  # no gradient through the weight


def test_dro_hand_computed_value_and_gradient() -> None:
    inputs = _inputs([[-1.0]], [[-1.5]], [[2.0]])
    out, grad, _ = _grad(dro_loss, inputs, dro_beta=0.5)
    # ℓ = −(A·log π − ½β(log π − log π_old)²) = −(2·(−1) − 0.25·0.25) = 2.0625
    assert out.per_token_loss.item() == pytest.approx(2.0625)
    # ∂ℓ/∂log π = −(A − β·(log π − log π_old)) = −(2 − 0.5·0.5) = −1.75
    assert grad.item() == pytest.approx(-1.75)
    assert out.metrics["ppo_kl"].item() == pytest.approx(-0.5)  # log π_old − log π


@pytest.mark.parametrize("beta", [None, 0.0, -1.0])
def test_dro_needs_a_positive_beta(beta) -> None:
    with pytest.raises(ValueError, match="dro_beta"):
        dro_loss(**_inputs([[-1.0]], [[-1.5]], [[2.0]]), dro_beta=beta)


def test_reinforce_with_and_without_importance_weights() -> None:
    inputs = _inputs([[-0.5, -2.0]], [[-0.7, -1.0]], [[2.0, -1.0]])
    weights = torch.tensor([[1.5, 0.25]], dtype=F64)
    plain, plain_grad, _ = _grad(reinforce_loss, inputs)
    weighted, weighted_grad, _ = _grad(reinforce_loss, inputs, rollout_is_weights=weights)
    # ℓ = −A·log π·w: [1, −2] without weights, [1.5, −0.5] with them; ∂ℓ/∂log π = −A·w
    torch.testing.assert_close(plain.per_token_loss, torch.tensor([[1.0, -2.0]], dtype=F64))
    torch.testing.assert_close(weighted.per_token_loss, torch.tensor([[1.5, -0.5]], dtype=F64))
    torch.testing.assert_close(plain_grad, torch.tensor([[-2.0, 1.0]], dtype=F64))
    torch.testing.assert_close(weighted_grad, torch.tensor([[-3.0, 0.25]], dtype=F64))
    # ppo_kl = mean(log π_rollout − log π) = ((−0.7 + 0.5) + (−1 + 2)) / 2 = 0.4
    assert plain.metrics["ppo_kl"].item() == pytest.approx(0.4)


def test_zero_advantages_give_zero_loss_for_score_function_losses() -> None:
    inputs = _random(seed=2)
    inputs["advantages"] = torch.zeros_like(inputs["advantages"])
    for loss_fn in (gpg_loss, cispo_loss, reinforce_loss):
        out, grad, _ = _grad(loss_fn, inputs)
        assert torch.count_nonzero(out.per_token_loss) == 0
        assert torch.count_nonzero(grad) == 0
    # DRO keeps its proximal term: ℓ = ½β(log r)², gradient β·log r
    out, grad, _ = _grad(dro_loss, inputs, dro_beta=2.0)
    log_ratio = inputs["log_prob"] - inputs["old_log_prob"]
    torch.testing.assert_close(out.per_token_loss, log_ratio.square())
    torch.testing.assert_close(grad, 2.0 * log_ratio)
