"""Checks the estimator registry: verl's names, inputs vs signatures, defaults, batch dispatch, purity."""

import inspect

import pytest
import torch

from stratarl.algo.advantages import ADVANTAGE_ESTIMATORS, AdvantageEstimator, get_advantage_estimator
from stratarl.algo.groups import group_ids_from_uids

VERL_091_NAMES = {
    "gae",
    "grpo",
    "grpo_vectorized",
    "grpo_passk",
    "gdpo",
    "rloo",
    "rloo_vectorized",
    "opo",
    "gpg",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "optimal_token_baseline",
    "tir_optimal_token_baseline",
}


def _batch():
    gen = torch.Generator().manual_seed(0)
    n, t = 8, 5
    mask = torch.ones(n, t, dtype=torch.long)
    mask[1, 3:] = 0
    mask[4, 1:3] = 0  # a tool result inside the response
    rewards = torch.zeros(n, t)
    rewards[:, -1] = torch.randn(n, generator=gen)
    log_prob = -torch.rand(n, t, generator=gen)
    return {
        "token_level_rewards": rewards,
        "response_mask": mask,
        "group": group_ids_from_uids(["a", "a", "b", "b", "b", "c", "c", "c"]),
        "values": torch.randn(n, t, generator=gen),
        "reward_baselines": torch.randn(n, generator=gen),
        "old_log_prob": log_prob,
        "sum_pi_squared": log_prob.exp() ** 2,
        "rollout_is_weights": torch.rand(n, t, generator=gen),
        "component_scores": {
            "format": torch.randint(0, 2, (n,), generator=gen).float(),
            "acc": torch.randn(n),
        },
        "unrelated_field": torch.zeros(3),
    }


def test_registry_holds_every_verl_091_estimator():
    assert set(ADVANTAGE_ESTIMATORS) == VERL_091_NAMES
    assert all(isinstance(entry, AdvantageEstimator) for entry in ADVANTAGE_ESTIMATORS.values())
    assert ADVANTAGE_ESTIMATORS["grpo_vectorized"].fn is ADVANTAGE_ESTIMATORS["grpo"].fn


@pytest.mark.parametrize("name", sorted(VERL_091_NAMES))
def test_declared_inputs_match_the_function_signature(name):
    entry = ADVANTAGE_ESTIMATORS[name]
    params = inspect.signature(entry.fn).parameters.values()
    required = {p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty}
    optional = {p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD and p.default is None}
    keyword_only = {p.name for p in params if p.kind is p.KEYWORD_ONLY}
    assert entry.inputs == required
    assert entry.optional_inputs == optional
    assert entry.hyperparameters == keyword_only
    assert not any(p.kind is p.VAR_KEYWORD for p in params), "no **kwargs swallowing"


def test_defaults_are_verls():
    def defaults(name):
        return {
            p.name: p.default for p in inspect.signature(ADVANTAGE_ESTIMATORS[name].fn).parameters.values()
        }

    assert defaults("gae")["gamma"] == 1.0 and defaults("gae")["lam"] == 1.0
    assert defaults("reinforce_plus_plus")["gamma"] == 1.0
    for name in ("grpo", "grpo_passk", "gdpo"):
        assert defaults(name)["eps"] == 1e-6 and defaults(name)["norm_adv_by_std"] is True
    for name in ("optimal_token_baseline", "tir_optimal_token_baseline"):
        assert defaults(name)["eps"] == 1e-8 and defaults(name)["handle_zero_tail"] is True
    assert defaults("gpg")["f_norm"] == 1.0


@pytest.mark.parametrize("name", sorted(VERL_091_NAMES))
def test_every_estimator_runs_from_a_batch_without_touching_it(name):
    batch = _batch()
    snapshot = {k: (v.clone() if isinstance(v, torch.Tensor) else dict(v)) for k, v in batch.items()}
    advantages, returns = get_advantage_estimator(name)(batch)
    assert advantages.shape == returns.shape == (8, 5)
    assert torch.isfinite(advantages).all() and torch.isfinite(returns).all()
    assert not advantages.requires_grad
    for key, before in snapshot.items():
        if isinstance(before, torch.Tensor):
            assert torch.equal(batch[key], before), f"{name} modified {key}"


def test_optional_inputs_are_passed_when_present():
    batch = _batch()
    otb = get_advantage_estimator("optimal_token_baseline")
    with_is, _ = otb(batch)
    without_is, _ = otb({k: v for k, v in batch.items() if k != "rollout_is_weights"})
    assert not torch.allclose(with_is, without_is)


def test_missing_fields_unknown_hyperparameters_and_unknown_names_fail_clearly():
    batch = _batch()
    del batch["values"]
    with pytest.raises(KeyError, match="values"):
        get_advantage_estimator("gae")(batch)
    with pytest.raises(TypeError, match="gamma"):
        get_advantage_estimator("grpo")(_batch(), gamma=0.9)
    with pytest.raises(ValueError, match="'grpo'"):
        get_advantage_estimator("gpro")
    with pytest.raises(ValueError, match="valid"):
        get_advantage_estimator("ppo")
