"""Parity with verl 0.9.1: every KL estimator (values and gradients, `+` variants included), the KL
controllers and the in-reward KL penalty, the clipped value loss, explained variance, entropy and
log-probs (plain and chunked), and the masked statistics, on identical seeded inputs, rtol 1e-5.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from stratarl.algo.aggregation import LOSS_AGGREGATIONS, aggregate_loss
from stratarl.algo.entropy import (
    entropy_from_logits,
    entropy_from_logits_chunked,
    log_prob_from_logits,
    log_prob_from_logits_chunked,
)
from stratarl.algo.kl import KL_ESTIMATORS, kl_penalty
from stratarl.algo.kl_control import apply_kl_penalty, make_kl_controller
from stratarl.algo.masked import masked_mean, masked_sum, masked_var, masked_whiten, response_mask_from_eos
from stratarl.algo.value_loss import clipped_value_loss, explained_variance
from tests.parity.verl_091 import (
    ATOL,
    NORMALIZERS,
    RESPONSE_LENGTH,
    check,
    log_probs,
    nearby_log_probs,
    normwise,
    response_mask,
)

pytestmark = pytest.mark.parity

DTYPES = [torch.float32, torch.float64]
N = 14


def kl_inputs(seed: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log π, log π_ref, mask); two tokens with |Δ| = 25 so that k3's clamps (±20, ±10) bind."""
    gen = torch.Generator().manual_seed(200 + seed)
    log_prob = log_probs(gen, (N, RESPONSE_LENGTH), dtype)
    ref = nearby_log_probs(gen, log_prob, 0.5 + seed)
    ref[0, 0], log_prob[1, 1] = log_prob[0, 0] - 25.0, ref[1, 1] - 25.0
    return log_prob, ref, response_mask(gen, N)


# ----------------------------------------------------------------------------------------- estimators


@pytest.mark.parametrize("kind", sorted(KL_ESTIMATORS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kl_estimator_values_and_gradients(verl, kind: str, dtype: torch.dtype, seed: int) -> None:
    log_prob, ref, _ = kl_inputs(seed, dtype)
    ours_in = [log_prob.clone().requires_grad_(), ref.clone().requires_grad_()]
    theirs_in = [log_prob.clone().requires_grad_(), ref.clone().requires_grad_()]
    ours = kl_penalty(*ours_in, kind)
    theirs = verl.core_algos.kl_penalty(*theirs_in, kind)
    check(f"kl/{kind}", ours, theirs, what="value")  # observed: bit-identical
    upstream = torch.randn(ours.shape, generator=torch.Generator().manual_seed(seed)).to(dtype)
    ours_grads = torch.autograd.grad((ours * upstream).sum(), ours_in)
    theirs_grads = torch.autograd.grad((theirs * upstream).sum(), theirs_in)
    for name, a, b in zip(("log_prob", "ref_log_prob"), ours_grads, theirs_grads, strict=True):
        check(f"kl/{kind}", a, b, what=f"d/d {name}")  # observed: bit-identical


def test_full_kl_raises_in_both(verl) -> None:
    log_prob, ref, _ = kl_inputs(0, torch.float32)
    for kind in ("full", "full+"):
        with pytest.raises(NotImplementedError):
            verl.core_algos.kl_penalty(log_prob, ref, kind)
        with pytest.raises(NotImplementedError):
            kl_penalty(log_prob, ref, kind)


# ------------------------------------------------------------------- controllers, in-reward KL penalty


@pytest.mark.parametrize("kind", sorted(KL_ESTIMATORS))
@pytest.mark.parametrize("controller", ["fixed", "adaptive"])
def test_apply_kl_penalty_and_controller(verl, kind: str, controller: str) -> None:
    """Five trainer steps: verl's ray_trainer.apply_kl_penalty (which also updates its controller)
    against ours followed by controller.update, as our docstring tells the trainer to do."""
    settings = {"kl_coef": 0.05, "target_kl": 0.02, "horizon": 40}
    theirs_ctrl = verl.core_algos.get_kl_controller(verl.KLControlConfig(type=controller, **settings))
    ours_ctrl = make_kl_controller(controller, **settings)
    for step in range(5):
        log_prob, ref, mask = kl_inputs(step, torch.float32)
        scores = torch.zeros(N, RESPONSE_LENGTH)
        scores[:, -1] = torch.randn(N, generator=torch.Generator().manual_seed(step))
        data = verl.DataProto.from_dict(
            tensors={
                "response_mask": mask,
                "token_level_scores": scores,
                "old_log_probs": log_prob,
                "ref_log_prob": ref,
            }
        )
        rewards, metrics = apply_kl_penalty(scores, log_prob, ref, mask, ours_ctrl.value, kind)
        ours_ctrl.update(metrics["reward_kl_penalty"], N)
        data, theirs_metrics = verl.ray_trainer.apply_kl_penalty(data, theirs_ctrl, kl_penalty=kind)
        check("kl_penalty_in_reward", rewards, data.batch["token_level_rewards"], what=f"rewards step {step}")
        check("kl_penalty_in_reward", {f"actor/{k}": v for k, v in metrics.items()}, theirs_metrics)
        check("kl_controller", ours_ctrl.value, theirs_ctrl.value, what=f"β after step {step}")
    if controller == "adaptive":
        assert ours_ctrl.value != settings["kl_coef"]  # the controller did move


# --------------------------------------------------------------------------- value loss, explained var


@pytest.mark.parametrize("mode", sorted(LOSS_AGGREGATIONS))
@pytest.mark.parametrize("normalizers", sorted(NORMALIZERS))
@pytest.mark.parametrize("cliprange", [0.2, 0.5])
@pytest.mark.parametrize("dtype", DTYPES)
def test_clipped_value_loss(verl, mode: str, normalizers: str, cliprange: float, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(300)
    vpreds, values, returns = (torch.randn(N, RESPONSE_LENGTH, generator=gen).to(dtype) for _ in range(3))
    mask = response_mask(gen, N).bool()  # verl's critic loss hands a bool mask
    settings = NORMALIZERS[normalizers]
    ours_in, theirs_in = vpreds.clone().requires_grad_(), vpreds.clone().requires_grad_()
    per_token, metrics = clipped_value_loss(ours_in, returns, values, mask, cliprange_value=cliprange)
    ours = aggregate_loss(
        per_token,
        mask,
        mode,
        dp_size=settings["dp_size"],
        global_num_tokens=settings["batch_num_tokens"],
        global_batch_size=settings["global_batch_size"],
        loss_scale_factor=settings["loss_scale_factor"],
    )
    theirs, clipfrac = verl.core_algos.compute_value_loss(
        theirs_in, returns, values, mask, cliprange, mode, **settings
    )
    check("value_loss", ours, theirs, what="loss")  # observed: ≤ 1e-8 relative (float64 1e-8 count)
    check("value_loss", metrics["vf_clipfrac"], clipfrac, what="vf_clipfrac")
    ours.backward()
    theirs.backward()
    check("value_loss", ours_in.grad, theirs_in.grad, what="gradient")


def _data_metrics_batch(verl, returns, values, mask):
    n, t = mask.shape
    return verl.DataProto.from_dict(
        tensors={
            "token_level_scores": torch.zeros(n, t),
            "token_level_rewards": torch.zeros(n, t),
            "advantages": torch.zeros(n, t),
            "returns": returns,
            "values": values,
            "prompts": torch.ones(n, 2, dtype=torch.long),
            "responses": torch.ones(n, t, dtype=torch.long),
            "response_mask": mask,
            "attention_mask": torch.cat([torch.ones(n, 2), mask], dim=1).long(),
        }
    )


@pytest.mark.parametrize("case", ["batch", "one_token", "empty"])
def test_explained_variance(verl, case: str) -> None:
    """verl's critic/vf_explained_var from metric_utils.compute_data_metrics."""
    gen = torch.Generator().manual_seed(400)
    returns = torch.randn(N, RESPONSE_LENGTH, generator=gen)
    values = returns + 0.5 * torch.randn(N, RESPONSE_LENGTH, generator=gen)
    mask = response_mask(gen, N)
    if case != "batch":  # fewer than two valid tokens: NaN in both (verl warns on torch.var)
        mask.zero_()
        mask[0, 0] = 1.0 if case == "one_token" else 0.0
    data = _data_metrics_batch(verl, returns, values, mask)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = verl.metric_utils.compute_data_metrics(data, use_critic=True)["critic/vf_explained_var"]
    check("explained_variance", explained_variance(returns, values, mask), theirs)  # observed: ≤ 1 ulp


# ------------------------------------------------------------------------------- entropy and log-probs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk", [1, 5, 2048])
def test_entropy_and_log_prob(verl, dtype: torch.dtype, chunk: int) -> None:
    """Plain and chunked forms against verl's torch_functional (values and gradients). verl's log-prob
    entry point is logprobs_from_logits (without flash-attn: its v2 loop); bf16 is excluded
    (docs/algorithms/kl_value_entropy.md: we compute in ≥ fp32, verl's v2 in bf16)."""
    gen = torch.Generator().manual_seed(500 + chunk)
    logits = (3.0 * torch.randn(N, RESPONSE_LENGTH, 37, generator=gen)).to(dtype)
    labels = torch.randint(0, 37, (N, RESPONSE_LENGTH), generator=gen)
    upstream = torch.randn(N, RESPONSE_LENGTH, generator=gen)
    pairs = {
        "entropy": (entropy_from_logits, verl.F.entropy_from_logits),
        "entropy_chunked": (
            lambda z: entropy_from_logits_chunked(z, chunk),
            lambda z: verl.F.entropy_from_logits_with_chunking(z.reshape(-1, 37), chunk).reshape(
                N, RESPONSE_LENGTH
            ),
        ),
        "log_prob": (
            lambda z: log_prob_from_logits(z, labels),
            lambda z: verl.F.logprobs_from_logits(z, labels),
        ),
        "log_prob_chunked": (
            lambda z: log_prob_from_logits_chunked(z, labels, chunk),
            lambda z: verl.F.logprobs_from_logits_naive(z, labels),
        ),
    }
    for family, (ours_fn, theirs_fn) in pairs.items():
        ours_in, theirs_in = logits.clone().requires_grad_(), logits.clone().requires_grad_()
        ours, theirs = ours_fn(ours_in), theirs_fn(theirs_in)
        label = f"{family}/{str(dtype).removeprefix('torch.')}"
        chunked_entropy = family == "entropy_chunked"
        # fp64 in: ours stays fp64, verl computes chunks in fp32 (kl_value_entropy.md 'Departures');
        # H = lse − E_p[z] cancels, so verl's fp32 value is off by up to 2.5e-6: compared normwise.
        exact_value = not (chunked_entropy and dtype == torch.float64)
        check(label, ours, theirs, atol=ATOL if exact_value else normwise(theirs), what="value")
        (ours * upstream.to(ours.dtype)).sum().backward()
        (theirs * upstream.to(theirs.dtype)).sum().backward()
        # Our chunked backward is the closed form p ⊙ (E_p[z] − z) (memory-bounded, same docs), verl's
        # is autograd through softmax and logsumexp: equal up to fp32 round-off of the centred logits,
        # ≤ 6.6e-6 with gradients of O(1) (ours 3.0e-6 and verl 1.2e-6 from the fp64 truth): normwise.
        atol = normwise(theirs_in.grad) if chunked_entropy else ATOL
        check(label, ours_in.grad, theirs_in.grad, atol=atol, what="gradient")


# ---------------------------------------------------------------------------------- masked statistics


@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_statistics(verl, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(600)
    values = torch.randn(N, RESPONSE_LENGTH, generator=gen).to(dtype)
    mask = response_mask(gen, N)
    for dim in (None, -1):
        check("masked_stats", masked_sum(values, mask, dim), verl.F.masked_sum(values, mask, dim))
        check("masked_stats", masked_mean(values, mask, dim), verl.F.masked_mean(values, mask, dim))
    check("masked_stats", masked_var(values, mask), verl.F.masked_var(values, mask))
    for shift in (True, False):
        check("masked_stats", masked_whiten(values, mask, shift), verl.F.masked_whiten(values, mask, shift))
    tokens = torch.randint(0, 6, (N, RESPONSE_LENGTH), generator=gen)
    for eos in (2, [2, 5]):
        check("masked_stats", response_mask_from_eos(tokens, eos), verl.F.get_response_mask(tokens, eos))
    assert np.isfinite(masked_var(values, mask).item())
