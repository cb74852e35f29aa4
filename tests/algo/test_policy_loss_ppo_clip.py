"""PPO clip with dual clip (`vanilla`): hand-computed tokens, a plain-loop reference, gradients, edges."""

from __future__ import annotations

import math

import pytest
import torch

from stratarl.algo.policy_loss.ppo_clip import ppo_clip_loss

F64 = torch.float64


def _tokens(ratios: list[float], advantages: list[float]) -> dict[str, torch.Tensor]:
    """One row whose log-ratios are log(ratios); old log-probs fixed at −1."""
    old = torch.full((1, len(ratios)), -1.0, dtype=F64)
    return {
        "log_prob": old + torch.tensor([ratios], dtype=F64).log(),
        "old_log_prob": old,
        "advantages": torch.tensor([advantages], dtype=F64),
        "response_mask": torch.ones(1, len(ratios)),
    }


def test_hand_computed_tokens_and_metrics() -> None:
    out = ppo_clip_loss(
        **_tokens([1.5, 0.5, 5.0, 1.0], [1.0, -1.0, -1.0, 2.0]),
        clip_ratio_low=0.2,
        clip_ratio_high=0.2,
        clip_ratio_c=3.0,
    )
    # A=+1, r=1.5: max(−1.5, −1·clip(1.5)=−1.2) = −1.2               (clip binds)
    # A=−1, r=0.5: max(0.5, clip(0.5)=0.8) = 0.8; min(0.8, 1·3) = 0.8   (clip binds)
    # A=−1, r=5:   max(5, 1.2) = 5; dual clip min(5, 3) = 3             (dual clip binds)
    # A=+2, r=1:   max(−2, −2) = −2
    torch.testing.assert_close(out.per_token_loss, torch.tensor([[-1.2, 0.8, 3.0, -2.0]], dtype=F64))
    assert out.metrics["pg_clipfrac"].item() == pytest.approx(2 / 4)  # tokens 1 and 2
    assert out.metrics["pg_clipfrac_lower"].item() == pytest.approx(1 / 4)  # token 3
    # ppo_kl = mean(−log r) = −(log 1.5 + log 0.5 + log 5 + log 1) / 4
    expected_kl = -(math.log(1.5) + math.log(0.5) + math.log(5.0)) / 4
    assert out.metrics["ppo_kl"].item() == pytest.approx(expected_kl, rel=1e-9)


def test_asymmetric_clip_uses_each_bound_on_its_side() -> None:
    out = ppo_clip_loss(**_tokens([1.25, 0.75], [1.0, -1.0]), clip_ratio_low=0.1, clip_ratio_high=0.28)
    # A=+1, r=1.25 < 1.28: unclipped −1.25.  A=−1, r=0.75 < 0.9: max(0.75, 0.9) = 0.9
    torch.testing.assert_close(out.per_token_loss, torch.tensor([[-1.25, 0.9]], dtype=F64))


def _loop_reference(log_prob, old_log_prob, advantages, low, high, c):
    """The dual-clip PPO surrogate token by token, with Python floats."""
    rows = []
    for lp_row, old_row, adv_row in zip(
        log_prob.tolist(), old_log_prob.tolist(), advantages.tolist(), strict=True
    ):
        row = []
        for lp, old, a in zip(lp_row, old_row, adv_row, strict=True):
            r = math.exp(min(max(lp - old, -20.0), 20.0))
            loss = max(-a * r, -a * min(max(r, 1 - low), 1 + high))
            if a < 0:
                loss = min(loss, -a * c)
            row.append(loss)
        rows.append(row)
    return torch.tensor(rows, dtype=F64)


@pytest.mark.parametrize(("low", "high", "c"), [(0.2, 0.2, 3.0), (0.1, 0.28, 1.5), (0.3, 0.1, 10.0)])
def test_vectorized_matches_plain_loop(low: float, high: float, c: float) -> None:
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(6, 8, generator=gen, dtype=F64) * 3
    log_prob = old + torch.randn(6, 8, generator=gen, dtype=F64) * 0.8  # many ratios beyond c
    log_prob[0, 0] = old[0, 0] + 25.0  # the ±20 clamp binds
    advantages = torch.randn(6, 8, generator=gen, dtype=F64)
    out = ppo_clip_loss(
        log_prob=log_prob,
        old_log_prob=old,
        advantages=advantages,
        response_mask=torch.ones(6, 8),
        clip_ratio_low=low,
        clip_ratio_high=high,
        clip_ratio_c=c,
    )
    expected = _loop_reference(log_prob, old, advantages, low, high, c)
    torch.testing.assert_close(out.per_token_loss, expected, rtol=1e-12, atol=1e-12)


def test_gradient_flows_only_where_no_bound_binds() -> None:
    inputs = _tokens([1.1, 1.5, 0.5, 5.0, 0.9], [1.0, 1.0, -1.0, -1.0, -2.0])
    log_prob = inputs.pop("log_prob").requires_grad_(True)
    out = ppo_clip_loss(log_prob=log_prob, **inputs)
    (grad,) = torch.autograd.grad(out.per_token_loss.sum(), log_prob)
    # unclipped: d(−A·r)/d log π = −A·r; clip or dual clip binding: 0
    expected = torch.tensor([[-1.0 * 1.1, 0.0, 0.0, 0.0, 2.0 * 0.9]], dtype=F64)
    torch.testing.assert_close(grad, expected)


def test_log_ratio_clamp_at_20() -> None:
    old = torch.zeros(1, 1, dtype=F64)
    log_prob = torch.full((1, 1), 30.0, dtype=F64, requires_grad=True)
    out = ppo_clip_loss(
        log_prob=log_prob,
        old_log_prob=old,
        advantages=torch.full((1, 1), 1.0, dtype=F64),
        response_mask=torch.ones(1, 1),
        clip_ratio_high=1e9,  # no PPO clip, so only the ±20 clamp limits r
    )
    assert out.per_token_loss.item() == pytest.approx(-math.exp(20.0))
    assert out.metrics["ppo_kl"].item() == pytest.approx(-20.0)
    (grad,) = torch.autograd.grad(out.per_token_loss.sum(), log_prob)
    assert grad.item() == 0.0  # the clamp binds, so no gradient


def test_ratio_exactly_one_gives_minus_advantage() -> None:
    out = ppo_clip_loss(**_tokens([1.0, 1.0, 1.0], [0.5, -2.0, 0.0]))
    torch.testing.assert_close(out.per_token_loss, torch.tensor([[-0.5, 2.0, 0.0]], dtype=F64))
    assert out.metrics["pg_clipfrac"].item() == 0.0
    assert out.metrics["pg_clipfrac_lower"].item() == 0.0
    assert out.metrics["ppo_kl"].item() == 0.0


def test_zero_advantages_give_zero_loss_and_gradient() -> None:
    inputs = _tokens([1.7, 0.3, 9.0], [0.0, 0.0, 0.0])
    log_prob = inputs.pop("log_prob").requires_grad_(True)
    out = ppo_clip_loss(log_prob=log_prob, **inputs)
    (grad,) = torch.autograd.grad(out.per_token_loss.sum(), log_prob)
    assert torch.count_nonzero(out.per_token_loss) == 0
    assert torch.count_nonzero(grad) == 0


def test_metrics_count_only_masked_tokens() -> None:
    inputs = _tokens([1.5, 5.0, 1.5, 5.0], [1.0, -1.0, 1.0, -1.0])
    inputs["response_mask"] = torch.tensor([[1, 1, 0, 0]])
    out = ppo_clip_loss(**inputs)
    assert out.metrics["pg_clipfrac"].item() == pytest.approx(1 / 2)  # token 0 of the 2 valid ones
    assert out.metrics["pg_clipfrac_lower"].item() == pytest.approx(1 / 2)  # token 1


def test_empty_mask_gives_zero_metrics() -> None:
    inputs = _tokens([1.5, 5.0], [1.0, -1.0])
    inputs["response_mask"] = torch.zeros(1, 2)
    out = ppo_clip_loss(**inputs)
    assert all(value.item() == 0.0 for value in out.metrics.values())


def test_rollout_is_weights_multiply_the_per_token_loss() -> None:
    inputs = _tokens([1.5, 0.5, 5.0], [1.0, -1.0, -1.0])
    weights = torch.tensor([[2.0, 0.5, 0.0]], dtype=F64)
    plain = ppo_clip_loss(**inputs).per_token_loss
    weighted = ppo_clip_loss(**inputs, rollout_is_weights=weights).per_token_loss
    torch.testing.assert_close(weighted, plain * weights)


def test_metrics_are_detached_and_inputs_untouched() -> None:
    inputs = _tokens([1.5, 0.5], [1.0, -1.0])
    inputs["log_prob"].requires_grad_(True)
    before = {name: tensor.detach().clone() for name, tensor in inputs.items()}
    out = ppo_clip_loss(**inputs)
    assert not any(value.requires_grad for value in out.metrics.values())
    for name, tensor in inputs.items():
        assert torch.equal(tensor.detach(), before[name])


def test_argument_checks() -> None:
    inputs = _tokens([1.5, 0.5], [1.0, -1.0])
    with pytest.raises(ValueError, match="clip_ratio_c"):
        ppo_clip_loss(**inputs, clip_ratio_c=1.0)
    with pytest.raises(ValueError, match="advantages shape"):
        ppo_clip_loss(**{**inputs, "advantages": inputs["advantages"][:, :1]})
    with pytest.raises(TypeError):
        ppo_clip_loss(
            inputs["log_prob"], inputs["old_log_prob"], inputs["advantages"], inputs["response_mask"]
        )
