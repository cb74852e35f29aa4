"""Parity with verl 0.9.1's rollout_corr_helper (IS weights, every rejection option and combinations,
off-policy diagnostics, the bypass-mode loss) and metric_utils' validation statistics, on identical
seeded inputs, rtol 1e-5.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stratarl.algo.policy_loss import compute_policy_loss
from stratarl.algo.rollout_correction import (
    RS_OPTIONS,
    offpolicy_metrics,
    rollout_corr_metrics,
    rollout_correction,
)
from stratarl.algo.validation_stats import bootstrap_metric, majority_value, process_validation_metrics
from tests.parity.verl_091 import (
    RESPONSE_LENGTH,
    actor_config,
    check,
    log_probs,
    nearby_log_probs,
    response_mask,
)

pytestmark = pytest.mark.parity

N = 16
DTYPES = [torch.float32, torch.float64]


def corr_inputs(seed: int, dtype: torch.dtype, scale: float = 0.3):
    """(log π_train, log π_rollout, mask): an all-masked row, gaps, two tokens 25 nats apart either way
    (the ±20 safety bound binds on both sides)."""
    gen = torch.Generator().manual_seed(700 + seed)
    rollout = log_probs(gen, (N, RESPONSE_LENGTH), dtype)
    train = nearby_log_probs(gen, rollout, scale)
    train[0, 0] = rollout[0, 0] - 25.0
    rollout[-1, 2] = train[-1, 2] - 25.0
    return train, rollout, response_mask(gen, N)


def _threshold(option: str) -> str | float:
    """A threshold that rejects some but not all: k1 options take ratio bounds, k2/k3 an upper bound."""
    if option.endswith("k1"):
        return "0.6_1.5" if option.startswith("token") else "0.7_1.3"
    return {"token": 0.05, "seq_sum": 0.4, "seq_mean": 0.04, "seq_max": 0.15}[option.rsplit("_", 1)[0]]


IS_CONFIGS = [
    {"rollout_is": level, "rollout_is_threshold": threshold, "rollout_is_batch_normalize": normalize}
    for level in ("token", "sequence")
    for threshold in (2.0, 1.2, "0.5_2.0", "0.8_1.25")
    for normalize in (False, True)
]
RS_CONFIGS = [
    {"rollout_rs": option, "rollout_rs_threshold": _threshold(option)} for option in sorted(RS_OPTIONS)
]
RS_CONFIGS += [
    {"rollout_rs": "token_k1", "rollout_rs_threshold": 1.4},  # one number u: bounds [1/u, u]
    {"rollout_rs": "seq_sum_k1,seq_max_k3,token_k2", "rollout_rs_threshold": "0.5_2.0,0.4,0.2"},
    {
        "rollout_rs": " seq_mean_k3, seq_mean_k1 ,seq_mean_k3",
        "rollout_rs_threshold": 1.1,
    },  # spaces, duplicate
    {"rollout_rs": ",".join(sorted(RS_OPTIONS)), "rollout_rs_threshold": 2.5},
]
COMBINED_CONFIGS = [
    {**IS_CONFIGS[0], **RS_CONFIGS[-3]},
    {**IS_CONFIGS[13], "rollout_rs": "seq_mean_k1,token_k1", "rollout_rs_threshold": "1.3"},
    {"rollout_is": None, **RS_CONFIGS[0]},
    {"rollout_is": "token", "rollout_is_threshold": None},  # IS switched off by a null threshold
]
CONFIGS = IS_CONFIGS + RS_CONFIGS + COMBINED_CONFIGS


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: ";".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rollout_correction(verl, config: dict, dtype: torch.dtype, seed: int) -> None:
    train, rollout, mask = corr_inputs(seed, dtype, scale=0.1 + 0.2 * seed)
    ours_weights, ours_mask, ours_metrics = rollout_correction(train, rollout, mask, **config)
    try:
        theirs = verl.rollout_corr_helper.compute_rollout_correction_and_rejection_mask(
            train, rollout, mask, **config
        )
    except ZeroDivisionError:
        # docs/algorithms/rollout_correction.md 'Departures': IcePop rejected every token; verl divides
        # by zero in its effective sample size, ours reports 0. The only input excluded here.
        assert (ours_weights == 0).all() and ours_metrics["rollout_corr/rollout_is_eff_sample_size"] == 0.0
        return
    theirs_weights = None if theirs[0] is None else theirs[0].batch["rollout_is_weights"]
    # Observed: masks identical; weights and metrics ≤ 3e-7 relative in float32, ≤ 1e-12 in float64.
    check("rollout_correction/weights", ours_weights, theirs_weights)
    check("rollout_correction/mask", ours_mask, theirs[1])
    check("rollout_correction/metrics", ours_metrics, theirs[2])


@pytest.mark.parametrize("with_rollout", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_offpolicy_diagnostics(verl, with_rollout: bool, dtype: torch.dtype) -> None:
    train, rollout, mask = corr_inputs(3, dtype)
    rollout = rollout if with_rollout else None
    theirs = verl.rollout_corr_helper.compute_offpolicy_metrics(train, rollout, mask)
    check("rollout_correction/diagnostics", offpolicy_metrics(train, rollout, mask), theirs)
    if with_rollout:
        theirs = verl.rollout_corr_helper.compute_rollout_corr_metrics_from_logprobs(train, rollout, mask)
        check("rollout_correction/diagnostics", rollout_corr_metrics(train, rollout, mask), theirs)


def test_empty_mask_raises_in_both(verl) -> None:
    train, rollout, mask = corr_inputs(0, torch.float32)
    with pytest.raises(ValueError):
        verl.rollout_corr_helper.compute_rollout_correction_and_rejection_mask(train, rollout, 0 * mask)
    with pytest.raises(ValueError):
        rollout_correction(train, rollout, 0 * mask)


BYPASS_CONFIGS = [
    {"rollout_is": "token", "rollout_is_threshold": 2.0},
    {
        "rollout_is": "sequence",
        "rollout_is_threshold": "0.5_2.0",
        "rollout_rs": "token_k1",
        "rollout_rs_threshold": 1.5,
    },
    {"rollout_is": None, "rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 0.05},
]


@pytest.mark.parametrize("loss_type", ["reinforce", "ppo_clip"])
@pytest.mark.parametrize("config", BYPASS_CONFIGS, ids=["token_is", "seq_icepop_rs", "rs_only"])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum"])
def test_bypass_mode_composition(verl, loss_type: str, config: dict, mode: str) -> None:
    """verl's `bypass_mode` loss against our composition of the pieces it dispatches to (the trainer's
    job here): rollout correction of π_θ vs π_rollout, then `reinforce` with the weights and the
    rejected mask, or `vanilla` with the rejected mask and no weights."""
    log_prob, rollout, mask = corr_inputs(4, torch.float32, scale=0.2)
    mask = mask.bool()
    advantages = torch.randn(N, RESPONSE_LENGTH, generator=torch.Generator().manual_seed(9))
    ours_lp, theirs_lp = log_prob.clone().requires_grad_(), log_prob.clone().requires_grad_()
    weights, kept, corr_metrics = rollout_correction(ours_lp.detach(), rollout, mask, **config)
    name, weights = ("reinforce", weights) if loss_type == "reinforce" else ("vanilla", None)
    ours, metrics = compute_policy_loss(
        name,
        log_prob=ours_lp,
        old_log_prob=rollout,
        advantages=advantages,
        response_mask=kept,
        loss_agg_mode=mode,
        rollout_is_weights=weights,
    )
    metrics = {**{f"actor/{k}": v for k, v in metrics.items()}, **corr_metrics}
    corr_config = verl.RolloutCorrectionConfig(bypass_mode=True, loss_type=loss_type, **config)
    actor = actor_config(verl, loss_agg_mode=mode, policy_loss={"rollout_correction": corr_config})
    actor.global_batch_info.update(
        dp_size=1, batch_num_tokens=None, global_batch_size=None, loss_scale_factor=None
    )
    theirs, theirs_metrics = verl.core_algos.get_policy_loss_fn("bypass_mode")(
        old_log_prob=rollout,
        log_prob=theirs_lp,
        advantages=advantages,
        response_mask=mask,
        loss_agg_mode=mode,
        config=actor,
    )
    check("bypass_mode", ours, theirs, what="loss")
    check("bypass_mode", metrics, theirs_metrics, what="metrics")
    ours.backward()
    theirs.backward()
    check("bypass_mode", ours_lp.grad, theirs_lp.grad, what="gradient")


# ------------------------------------------------------------------------------ validation statistics


def validation_inputs(seed: int, n: int, with_none: bool = False):
    rng = np.random.RandomState(seed)
    prompts = 5
    sources = [f"source-{p % 2}" for p in range(prompts) for _ in range(n)]
    uids = [f"uid-{p}" for p in range(prompts) for _ in range(n)]
    infos = {
        "acc": rng.randint(0, 2, prompts * n).astype(float).tolist(),
        "reward": rng.randn(prompts * n).tolist(),
        "pred": [str(x) for x in rng.randint(0, 3, prompts * n)],
        "label": ["text"] * (prompts * n),  # a string variable: skipped by both
    }
    if with_none:  # failed sessions leave None in the extra infos (verl 0.9.1 drops them)
        for i in rng.choice(prompts * n, size=max(1, prompts * n // 5), replace=False):
            infos["acc"][i] = None
        infos["pred"][0] = None
    return sources, uids, infos


def _without_pass_at_k(result: dict) -> dict:
    """Ours also reports the unbiased pass@k (docs/algorithms/validation.md 'Departures'); verl does not."""
    return {
        source: {
            var: {m: v for m, v in metrics.items() if not m.startswith("pass@")}
            for var, metrics in by_var.items()
        }
        for source, by_var in result.items()
    }


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("with_none", [False, True])
def test_process_validation_metrics(verl, n: int, with_none: bool) -> None:
    sources, uids, infos = validation_inputs(n, n, with_none)
    theirs = verl.metric_utils.process_validation_metrics(sources, uids, infos)
    ours = process_validation_metrics(sources, uids, infos)
    check("validation", _without_pass_at_k(ours), theirs)  # observed: identical


@pytest.mark.parametrize("n", [2, 4, 6])
def test_process_validation_metrics_with_expected_counts(verl, n: int) -> None:
    """verl 0.9.1's v1 trainer passes the expected number of sessions per prompt: missing `acc`
    values count as 0 and `acc_success_only` keeps the mean over the sessions that finished."""
    sources, uids, infos = validation_inputs(10 + n, n, with_none=True)
    expected = {(s, u): n for s, u in zip(sources, uids, strict=True)}
    expected[("source-0", "uid-missing")] = n  # a prompt none of whose sessions finished
    expected[("source-9", "uid-other")] = n  # a source that reports no acc: left alone
    theirs = verl.metric_utils.process_validation_metrics(sources, uids, infos, expected_acc_counts=expected)
    ours = process_validation_metrics(sources, uids, infos, expected_acc_counts=expected)
    check("validation", _without_pass_at_k(ours), theirs)


def test_bootstrap_and_majority(verl) -> None:
    rng = np.random.RandomState(0)
    values = rng.randn(7).tolist()
    for k in (1, 3, 7):
        theirs = verl.metric_utils.bootstrap_metric(values, k, [np.max, np.min, np.mean], seed=3)
        check("validation", bootstrap_metric(values, k, [np.max, np.min, np.mean], seed=3), theirs)
    votes = [{"pred": p, "val": v} for p, v in zip("abcabba", values, strict=True)]
    assert majority_value(votes) == verl.metric_utils.calc_maj_val(votes, vote_key="pred", val_key="val")
