"""Parity with verl 0.9.1: every policy loss (verl's registry, plus the `reinforce` loss of its bypass
mode) × every aggregation mode × with/without rollout IS weights × local, dp_size > 1 with global counts,
and loss_scale_factor, in float32 and float64: loss, gradient and metrics within rtol 1e-5; and
`agg_loss` itself for every mode and mask dtype.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from stratarl.algo.aggregation import LOSS_AGGREGATIONS, aggregate_loss
from stratarl.algo.policy_loss import POLICY_LOSSES, compute_policy_loss
from tests.parity.verl_091 import (
    GROUP_SIZES,
    NORMALIZERS,
    RESPONSE_LENGTH,
    actor_config,
    check,
    log_probs,
    nearby_log_probs,
    response_mask,
    with_extreme_ratios,
)

pytestmark = pytest.mark.parity

DTYPES = [torch.float32, torch.float64]
MODES = sorted(LOSS_AGGREGATIONS)

# verl's actor config for the losses (verl field -> value); ours receives the same as keyword arguments.
LOSS_SETTINGS = {
    "clip_ratio_low": 0.2,
    "clip_ratio_high": 0.28,
    "clip_ratio_c": 3.0,
    "tau_pos": 1.0,
    "tau_neg": 1.05,
}
POLICY_LOSS_SETTINGS = {
    "clip_cov_ratio": 0.05,  # verl's 2e-4 would zero one token of a batch this small; 0.05 zeroes several
    "clip_cov_lb": 1.0,
    "clip_cov_ub": 5.0,
    "kl_cov_ratio": 0.05,
    "ppo_kl_coef": 0.1,
    "dro_beta": 0.1,
}
CLIP_COV_SEED = 1234  # clip_cov draws with torch.randperm from the global RNG, in verl and here


def loss_batch(seed: int, dtype: torch.dtype) -> dict[str, Tensor]:
    gen = torch.Generator().manual_seed(100 + seed)
    n = sum(GROUP_SIZES)
    mask = response_mask(gen, n)
    log_prob = log_probs(gen, (n, RESPONSE_LENGTH), dtype)
    log_prob, old_log_prob = with_extreme_ratios(log_prob, nearby_log_probs(gen, log_prob, 0.3))
    advantages = torch.randn(n, RESPONSE_LENGTH, generator=gen).to(dtype)
    advantages[3] = 0.0  # A = 0 exactly: sign(A), the A > 0 gates
    advantages[4, :4] = advantages[4, 0]  # one sequence-level advantage
    weights = (2.0 * torch.rand(n, RESPONSE_LENGTH, generator=gen)).to(dtype)
    return {
        "log_prob": log_prob,
        "old_log_prob": old_log_prob,
        "advantages": advantages,
        "response_mask": mask.bool(),  # verl's ppo_loss hands the losses a bool mask
        "rollout_is_weights": weights,
    }


def _verl_policy_loss(
    verl, name: str, batch: dict, log_prob: Tensor, mode: str, normalizers: dict, weighted: bool
):
    config = actor_config(
        verl,
        loss_agg_mode=mode,
        loss_scale_factor=normalizers["loss_scale_factor"],
        policy_loss=POLICY_LOSS_SETTINGS,
        **LOSS_SETTINGS,
    )
    config.global_batch_info.update(normalizers)  # what verl's ppo_loss does before calling the loss
    weights = batch["rollout_is_weights"] if weighted else None
    common = {
        "log_prob": log_prob,
        "advantages": batch["advantages"],
        "response_mask": batch["response_mask"],
    }
    common.update(loss_agg_mode=mode, config=config, rollout_is_weights=weights)
    torch.manual_seed(CLIP_COV_SEED)
    if name == "reinforce":  # not a verl loss_mode: the loss that verl's bypass mode dispatches to
        return verl.core_algos.compute_policy_loss_reinforce(rollout_log_prob=batch["old_log_prob"], **common)
    return verl.core_algos.get_policy_loss_fn(name)(old_log_prob=batch["old_log_prob"], **common)


def _our_policy_loss(name: str, batch: dict, log_prob: Tensor, mode: str, normalizers: dict, weighted: bool):
    settings = {**LOSS_SETTINGS, **POLICY_LOSS_SETTINGS}
    hyperparameters = {key: settings[key] for key in POLICY_LOSSES[name].hyperparameters if key in settings}
    torch.manual_seed(CLIP_COV_SEED)
    return compute_policy_loss(
        name,
        log_prob=log_prob,
        old_log_prob=batch["old_log_prob"],
        advantages=batch["advantages"],
        response_mask=batch["response_mask"],
        loss_agg_mode=mode,
        rollout_is_weights=batch["rollout_is_weights"] if weighted else None,
        dp_size=normalizers["dp_size"],
        global_num_tokens=normalizers["batch_num_tokens"],
        global_batch_size=normalizers["global_batch_size"],
        loss_scale_factor=normalizers["loss_scale_factor"],
        **hyperparameters,
    )


def test_every_verl_loss_mode_is_registered(verl) -> None:
    # bypass_mode is a composition (rollout correction + reinforce/vanilla), compared in
    # test_verl_091_rollout_validation.py; reinforce is its loss, registered here by name.
    assert set(verl.core_algos.POLICY_LOSS_REGISTRY) - {"bypass_mode"} == set(POLICY_LOSSES) - {"reinforce"}


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("normalizers", sorted(NORMALIZERS))
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_policy_loss(
    verl, name: str, mode: str, normalizers: str, weighted: bool, dtype: torch.dtype
) -> None:
    batch = loss_batch(len(name) + len(mode), dtype)
    ours_lp = batch["log_prob"].clone().requires_grad_()
    theirs_lp = batch["log_prob"].clone().requires_grad_()
    ours, ours_metrics = _our_policy_loss(name, batch, ours_lp, mode, NORMALIZERS[normalizers], weighted)
    theirs, theirs_metrics = _verl_policy_loss(
        verl, name, batch, theirs_lp, mode, NORMALIZERS[normalizers], weighted
    )
    # Observed: float32 bit-identical except geo_mean (≤ 1 ulp); float64 ≤ 1e-8 relative (verl adds its
    # 1e-8 to an integer count, which makes that denominator float32).
    check(f"policy_loss/{name}", ours, theirs, what="loss")
    ours.backward()
    theirs.backward()
    check(f"policy_loss/{name}", ours_lp.grad, theirs_lp.grad, what="d loss / d log_prob")
    check(
        f"policy_loss/{name}",
        {f"actor/{k}": v for k, v in ours_metrics.items()},
        theirs_metrics,
        what="metrics",
    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("normalizers", sorted(NORMALIZERS))
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32, torch.int64])
@pytest.mark.parametrize("dtype", DTYPES)
def test_loss_aggregation(
    verl, mode: str, normalizers: str, mask_dtype: torch.dtype, dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(7)
    n = sum(GROUP_SIZES)
    mask = response_mask(gen, n).to(mask_dtype)
    loss = (3.0 * torch.randn(n, RESPONSE_LENGTH, generator=gen)).to(dtype)
    ours_in, theirs_in = loss.clone().requires_grad_(), loss.clone().requires_grad_()
    settings = NORMALIZERS[normalizers]
    ours = aggregate_loss(
        ours_in,
        mask,
        mode,
        dp_size=settings["dp_size"],
        global_num_tokens=settings["batch_num_tokens"],
        global_batch_size=settings["global_batch_size"],
        loss_scale_factor=settings["loss_scale_factor"],
    )
    theirs = verl.core_algos.agg_loss(theirs_in, mask, mode, **settings)
    # Observed: bit-identical in float32; ≤ 1e-8 relative in float64 (see test_policy_loss).
    check(f"aggregation/{mode}", ours, theirs, what="value")
    ours.backward()
    theirs.backward()
    check(f"aggregation/{mode}", ours_in.grad, theirs_in.grad, what="gradient")


@pytest.mark.parametrize("mode", MODES)
def test_empty_batch_is_the_documented_departure(verl, mode: str) -> None:
    """docs/algorithms/losses.md §2 'Departures': an all-masked batch gives 0 here, NaN in verl's
    token-mean and seq-mean modes (token-sum is 0 in both). The only input excluded above."""
    loss, mask = torch.randn(3, 4), torch.zeros(3, 4)
    ours, theirs = aggregate_loss(loss, mask, mode), verl.core_algos.agg_loss(loss, mask, mode)
    assert ours.item() == 0.0
    assert theirs.item() == 0.0 if mode == "token-sum" else torch.isnan(theirs)


@pytest.mark.parametrize("mode", [mode for mode in MODES if mode != "token-sum"])
def test_missing_global_count_with_several_ranks_raises_in_both(verl, mode: str) -> None:
    loss, mask = torch.randn(3, 4), torch.ones(3, 4)
    with pytest.raises(ValueError):
        verl.core_algos.agg_loss(loss, mask, mode, dp_size=2)
    with pytest.raises(ValueError):
        aggregate_loss(loss, mask, mode, dp_size=2)
