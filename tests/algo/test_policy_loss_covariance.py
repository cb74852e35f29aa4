"""Clip-Cov and KL-Cov: which tokens are selected, reproducible random draws, the loss on and off them."""

from __future__ import annotations

import math

import pytest
import torch

from stratarl.algo.policy_loss.covariance import clip_cov_loss, kl_cov_loss

F64 = torch.float64


def _random_inputs(seed: int, n: int = 6, t: int = 8) -> dict:
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, t, generator=gen, dtype=F64) * 4
    lengths = torch.tensor([8, 5, 0, 8, 3, 6])[:n]
    return {
        "log_prob": old + torch.randn(n, t, generator=gen, dtype=F64) * 0.3,
        "old_log_prob": old,
        "advantages": torch.randn(n, 1, generator=gen, dtype=F64).expand(n, t).clone() * 2,
        "response_mask": (torch.arange(t)[None, :] < lengths[:, None]).long(),
    }


def _ppo_branches(inputs: dict, low: float = 0.2, high: float = 0.2) -> tuple[torch.Tensor, torch.Tensor]:
    """(−A·r, −A·clip(r)) with the unclamped ratio, as clip_cov computes them."""
    ratio = torch.exp(inputs["log_prob"] - inputs["old_log_prob"])
    adv = inputs["advantages"]
    return -adv * ratio, -adv * ratio.clamp(1 - low, 1 + high)


def _ppo_without_dual_clip(inputs: dict) -> torch.Tensor:
    return torch.maximum(*_ppo_branches(inputs))


def _covariance(inputs: dict) -> torch.Tensor:
    """(A − mean A)·(log π − mean log π), means over the valid tokens."""
    mask = inputs["response_mask"].to(F64)
    count = mask.sum() + 1e-8
    adv, log_prob = inputs["advantages"], inputs["log_prob"]
    return (adv - (adv * mask).sum() / count) * (log_prob - (log_prob * mask).sum() / count)


def test_clip_cov_zeroes_a_random_subset_of_the_candidates() -> None:
    inputs = _random_inputs(seed=0)
    lb, ub, ratio = -1.0, 1.0, 0.25
    out = clip_cov_loss(
        **inputs,
        clip_cov_ratio=ratio,
        clip_cov_lb=lb,
        clip_cov_ub=ub,
        generator=torch.Generator().manual_seed(7),
    )
    surrogate = _ppo_without_dual_clip(inputs)
    valid = inputs["response_mask"] > 0
    cov = _covariance(inputs)
    unclipped, clipped = _ppo_branches(inputs)
    candidates = valid & (cov > lb) & (cov < ub) & ~(clipped > unclipped)  # not already clipped by PPO
    zeroed = (out.per_token_loss == 0) & (surrogate != 0)
    expected_count = min(max(int(ratio * int(valid.sum())), 1), int(candidates.sum()))  # ⌊0.25 · 30⌋ = 7
    assert expected_count == 7 < int(candidates.sum())  # a true draw: fewer picks than candidates
    assert int(zeroed.sum()) == expected_count
    assert bool((zeroed <= candidates).all())  # only candidates are zeroed
    kept = ~zeroed
    torch.testing.assert_close(out.per_token_loss[kept], surrogate[kept])
    assert out.metrics["pg_clipfrac"].item() == pytest.approx(expected_count / int(valid.sum()))


def test_clip_cov_never_selects_tokens_already_clipped_by_ppo() -> None:
    inputs = _random_inputs(seed=0)
    # ratio 1 and bounds wider than any covariance: every candidate is zeroed
    out = clip_cov_loss(**inputs, clip_cov_ratio=1.0, clip_cov_lb=-100.0, clip_cov_ub=100.0)
    unclipped, clipped = _ppo_branches(inputs)
    valid = inputs["response_mask"] > 0
    clipped_by_ppo = (clipped > unclipped) & valid
    assert int(clipped_by_ppo.sum()) > 0
    torch.testing.assert_close(out.per_token_loss[clipped_by_ppo], clipped[clipped_by_ppo])
    assert torch.count_nonzero(out.per_token_loss[valid & ~clipped_by_ppo]) == 0
    expected_share = int((valid & ~clipped_by_ppo).sum()) / int(valid.sum())
    assert out.metrics["pg_clipfrac"].item() == pytest.approx(expected_share)


def test_clip_cov_draw_is_reproducible_with_a_generator() -> None:
    inputs = _random_inputs(seed=1)
    hyper = {"clip_cov_ratio": 0.1, "clip_cov_lb": -100.0, "clip_cov_ub": 100.0}  # 3 of ~25 candidates
    first = clip_cov_loss(**inputs, **hyper, generator=torch.Generator().manual_seed(11)).per_token_loss
    again = clip_cov_loss(**inputs, **hyper, generator=torch.Generator().manual_seed(11)).per_token_loss
    assert torch.equal(first, again)
    draws = {
        tuple(
            (clip_cov_loss(**inputs, **hyper, generator=torch.Generator().manual_seed(s)).per_token_loss == 0)
            .flatten()
            .tolist()
        )
        for s in range(8)
    }
    assert len(draws) > 1  # the selection is random, not the first candidates


def test_clip_cov_without_generator_uses_the_global_rng() -> None:
    inputs = _random_inputs(seed=1)
    hyper = {"clip_cov_ratio": 0.2, "clip_cov_lb": -1.0, "clip_cov_ub": 1.0}
    torch.manual_seed(5)
    first = clip_cov_loss(**inputs, **hyper).per_token_loss
    torch.manual_seed(5)
    assert torch.equal(clip_cov_loss(**inputs, **hyper).per_token_loss, first)


def test_clip_cov_zeroed_tokens_have_no_gradient() -> None:
    inputs = _random_inputs(seed=2)
    log_prob = inputs.pop("log_prob").requires_grad_(True)
    out = clip_cov_loss(
        log_prob=log_prob,
        **inputs,
        clip_cov_ratio=0.3,
        clip_cov_lb=-1.0,
        clip_cov_ub=1.0,
        generator=torch.Generator().manual_seed(0),
    )
    (grad,) = torch.autograd.grad(out.per_token_loss.sum(), log_prob)
    zeroed = out.per_token_loss == 0
    assert int(zeroed.sum()) > 0
    assert torch.count_nonzero(grad[zeroed]) == 0


def test_clip_cov_without_candidates_is_plain_ppo_clip() -> None:
    inputs = _random_inputs(seed=3)
    out = clip_cov_loss(**inputs, clip_cov_lb=1e6, clip_cov_ub=2e6)  # no covariance that large
    torch.testing.assert_close(out.per_token_loss, _ppo_without_dual_clip(inputs))
    assert out.metrics["pg_clipfrac"].item() == 0.0


def test_kl_cov_hand_computed() -> None:
    # one row of 4 valid tokens; log π = [−1, −2, −3, −4] (mean −2.5), A = [2, 0, 0, −2] (mean 0)
    # cov = A·(log π + 2.5) = [2·1.5, 0, 0, −2·(−1.5)] = [3, 0, 0, 3]; ⌊0.5·4⌋ = 2 tokens: 0 and 3
    log_prob = torch.tensor([[-1.0, -2.0, -3.0, -4.0]], dtype=F64)
    old = log_prob - torch.tensor([[0.1, 0.2, -0.3, -0.4]], dtype=F64)  # log r = [0.1, 0.2, −0.3, −0.4]
    advantages = torch.tensor([[2.0, 0.0, 0.0, -2.0]], dtype=F64)
    out = kl_cov_loss(
        log_prob=log_prob,
        old_log_prob=old,
        advantages=advantages,
        response_mask=torch.ones(1, 4),
        kl_cov_ratio=0.5,
        ppo_kl_coef=0.1,
    )
    r = [math.exp(0.1), math.exp(0.2), math.exp(-0.3), math.exp(-0.4)]
    expected = [-2 * r[0] + 0.1 * 0.1, 0.0, 0.0, 2 * r[3] + 0.1 * 0.4]  # + coef·|log r| on tokens 0, 3
    torch.testing.assert_close(out.per_token_loss, torch.tensor([expected], dtype=F64))
    assert out.metrics["ppo_kl"].item() == pytest.approx((0.1 + 0.2 + 0.3 + 0.4) / 4)  # mean |log r|


def test_kl_cov_ignores_masked_tokens_and_penalizes_at_least_one() -> None:
    inputs = _random_inputs(seed=4)
    base = kl_cov_loss(**inputs, kl_cov_ratio=1e-6, ppo_kl_coef=1.0)  # ⌊1e-6 · 30⌋ = 0 → 1 token
    surrogate = -inputs["advantages"] * torch.exp(inputs["log_prob"] - inputs["old_log_prob"])
    penalized = ~torch.isclose(base.per_token_loss, surrogate, rtol=0, atol=1e-15)
    assert int(penalized.sum()) == 1
    changed = {**inputs, "log_prob": inputs["log_prob"].masked_fill(inputs["response_mask"] == 0, 5.0)}
    changed_out = kl_cov_loss(**changed, kl_cov_ratio=1e-6, ppo_kl_coef=1.0)
    valid = inputs["response_mask"] > 0
    torch.testing.assert_close(changed_out.per_token_loss[valid], base.per_token_loss[valid])


def test_kl_cov_empty_mask_penalizes_nothing() -> None:
    inputs = _random_inputs(seed=5)
    inputs["response_mask"] = torch.zeros_like(inputs["response_mask"])
    out = kl_cov_loss(**inputs)
    surrogate = -inputs["advantages"] * torch.exp(inputs["log_prob"] - inputs["old_log_prob"])
    torch.testing.assert_close(out.per_token_loss, surrogate)
    assert out.metrics["ppo_kl"].item() == 0.0


def test_ratios_must_be_positive() -> None:
    inputs = _random_inputs(seed=6)
    with pytest.raises(ValueError, match="clip_cov_ratio"):
        clip_cov_loss(**inputs, clip_cov_ratio=0.0)
    with pytest.raises(ValueError, match="kl_cov_ratio"):
        kl_cov_loss(**inputs, kl_cov_ratio=0.0)
