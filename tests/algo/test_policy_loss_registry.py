"""The policy-loss registry, `compute_policy_loss`, forced aggregations, and invariances of all losses."""

from __future__ import annotations

import pytest
import torch

from stratarl.algo.aggregation import aggregate_loss
from stratarl.algo.policy_loss import POLICY_LOSSES, compute_policy_loss, get_policy_loss

F64 = torch.float64
VERL_LOSS_MODES = {
    "vanilla",
    "dppo_tv",
    "dppo_kl",
    "gspo",
    "sapo",
    "gpg",
    "clip_cov",
    "kl_cov",
    "geo_mean",
    "dro",
    "cispo",
}  # verl 0.9.1's registered loss modes, less bypass_mode (a dispatcher, see docs/algorithms/losses.md)


def _hyper(name: str) -> dict:
    """Hyper-parameters a loss needs beyond its defaults (a fresh generator keeps clip_cov reproducible)."""
    return {
        "dro": {"dro_beta": 0.3},
        "clip_cov": {
            "clip_cov_ratio": 0.2,
            "clip_cov_lb": -1.0,
            "clip_cov_ub": 1.0,
            "generator": torch.Generator().manual_seed(0),
        },
        "kl_cov": {"kl_cov_ratio": 0.2},
    }.get(name, {})


def _batch(seed: int = 0, n: int = 6, t: int = 5) -> dict:
    gen = torch.Generator().manual_seed(seed)
    old = torch.rand(n, t, generator=gen, dtype=F64).clamp(0.05, 0.95).log()
    lengths = torch.tensor([5, 2, 0, 4, 5, 1])[:n]
    weights = torch.rand(n, t, generator=gen, dtype=F64) + 0.5
    return {
        "log_prob": (old + torch.randn(n, t, generator=gen, dtype=F64) * 0.4).clamp(max=-1e-3),
        "old_log_prob": old,
        "advantages": torch.randn(n, 1, generator=gen, dtype=F64).expand(n, t).clone(),
        "response_mask": (torch.arange(t)[None, :] < lengths[:, None]).long(),
        "rollout_is_weights": weights,
    }


def _loss_and_grad(name: str, batch: dict, **kwargs) -> tuple[torch.Tensor, torch.Tensor, dict]:
    log_prob = batch["log_prob"].clone().requires_grad_(True)
    loss, metrics = compute_policy_loss(name, **{**batch, "log_prob": log_prob}, **_hyper(name), **kwargs)
    (grad,) = torch.autograd.grad(loss, log_prob)
    return loss, grad, metrics


def test_registry_holds_verl_losses_and_reinforce() -> None:
    assert set(POLICY_LOSSES) == VERL_LOSS_MODES | {"reinforce"}


def test_unknown_name_names_the_closest() -> None:
    with pytest.raises(ValueError, match=r"Did you mean 'vanilla'\?"):
        get_policy_loss("vanila")


def test_declared_aggregations_follow_verl_091() -> None:
    assert get_policy_loss("sapo").forced_aggregation == "seq-mean-token-mean"
    assert get_policy_loss("gspo").forced_aggregation is None  # 0.9.1 uses the actor's loss_agg_mode
    assert get_policy_loss("geo_mean").local_row_mean
    forced = {
        name for name, entry in POLICY_LOSSES.items() if entry.forced_aggregation or entry.local_row_mean
    }
    assert forced == {"sapo", "geo_mean"}


def test_hyperparameter_names() -> None:
    assert get_policy_loss("vanilla").hyperparameters == ("clip_ratio_low", "clip_ratio_high", "clip_ratio_c")
    assert get_policy_loss("gpg").hyperparameters == ()
    assert "generator" in get_policy_loss("clip_cov").hyperparameters


def test_unknown_hyperparameter_is_an_error() -> None:
    with pytest.raises(TypeError):
        compute_policy_loss("vanilla", **_batch(), tau_pos=1.0)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_gspo_and_vanilla_use_the_requested_mode(mode: str) -> None:
    batch = _batch()
    for name in ("gspo", "vanilla"):
        loss, _ = compute_policy_loss(name, **batch, loss_agg_mode=mode)
        per_token = get_policy_loss(name).fn(**batch).per_token_loss
        assert loss.item() == aggregate_loss(per_token, batch["response_mask"], mode).item()


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_output_contract(name: str) -> None:
    batch = _batch()
    batch["log_prob"].requires_grad_(True)
    before = {key: value.detach().clone() for key, value in batch.items()}
    out = get_policy_loss(name).fn(**batch, **_hyper(name))
    assert out.per_token_loss.shape == batch["log_prob"].shape
    assert out.per_token_loss.requires_grad
    assert all(not value.requires_grad and value.dim() == 0 for value in out.metrics.values())
    assert set(out.metrics) <= {"pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"}
    for key, value in batch.items():
        assert torch.equal(value.detach(), before[key]), f"{name} changed {key} in place"


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_right_padding_changes_nothing(name: str, mode: str) -> None:
    batch = _batch()
    loss, grad, metrics = _loss_and_grad(name, batch, loss_agg_mode=mode)
    n = batch["log_prob"].shape[0]
    fill = {
        "log_prob": -0.7,
        "old_log_prob": -3.0,
        "advantages": 5.0,
        "response_mask": 0,
        "rollout_is_weights": 9.0,
    }
    padded = {
        key: torch.cat([value, torch.full((n, 3), fill[key], dtype=value.dtype)], dim=1)
        for key, value in batch.items()
    }
    loss_pad, grad_pad, metrics_pad = _loss_and_grad(name, padded, loss_agg_mode=mode)
    torch.testing.assert_close(loss_pad, loss, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad_pad[:, : grad.shape[1]], grad, rtol=1e-12, atol=1e-14)
    assert torch.count_nonzero(grad_pad[:, grad.shape[1] :]) == 0
    for key, value in metrics.items():
        torch.testing.assert_close(metrics_pad[key], value, rtol=1e-12, atol=1e-14)


# clip_cov and kl_cov select tokens from batch-wide covariance statistics, so a rank sees other tokens
# than the whole batch; verl shares that property. geo_mean is checked with an equal split below.
SPLIT_INVARIANT = sorted(set(POLICY_LOSSES) - {"clip_cov", "kl_cov", "geo_mean"})


@pytest.mark.parametrize("name", SPLIT_INVARIANT)
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_split_over_ranks_matches_the_whole_batch(name: str, mode: str) -> None:
    batch = _batch()
    normalizers = {"global_num_tokens": int(batch["response_mask"].sum()), "global_batch_size": 6}
    whole, whole_grad, _ = _loss_and_grad(name, batch, loss_agg_mode=mode, **normalizers)
    parts = [{key: value[rows] for key, value in batch.items()} for rows in (slice(0, 2), slice(2, 6))]
    results = [_loss_and_grad(name, part, loss_agg_mode=mode, dp_size=2, **normalizers) for part in parts]
    torch.testing.assert_close((results[0][0] + results[1][0]) / 2, whole, rtol=1e-12, atol=1e-14)
    # each rank holds the gradient of its own rows; DP averaging divides their sum by 2
    torch.testing.assert_close(
        torch.cat([results[0][1], results[1][1]]) / 2, whole_grad, rtol=1e-12, atol=1e-14
    )


def test_geo_mean_local_row_mean_is_consistent_over_equal_splits() -> None:
    batch = _batch()
    whole, whole_grad, _ = _loss_and_grad("geo_mean", batch)
    parts = [{key: value[rows] for key, value in batch.items()} for rows in (slice(0, 3), slice(3, 6))]
    results = [_loss_and_grad("geo_mean", part, dp_size=2, global_batch_size=6) for part in parts]
    torch.testing.assert_close((results[0][0] + results[1][0]) / 2, whole, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(
        torch.cat([results[0][1], results[1][1]]) / 2, whole_grad, rtol=1e-12, atol=1e-14
    )


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_empty_mask_gives_a_zero_loss_and_finite_gradient(name: str) -> None:
    batch = _batch()
    batch["response_mask"] = torch.zeros_like(batch["response_mask"])
    loss, grad, metrics = _loss_and_grad(name, batch)
    assert loss.item() == 0.0
    assert torch.count_nonzero(grad) == 0
    assert all(value.item() == 0.0 for value in metrics.values())
