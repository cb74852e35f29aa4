"""Parity with verl 0.9.1 (the PyPI wheel, `make test-parity`): every advantage estimator, called the
way verl's trainer calls it, on identical seeded inputs (groups of one, multi-turn masks with gaps, an
all-masked row, float32 and float64), within rtol 1e-5. The other families live next to this module:
policy losses and aggregation (test_verl_091_losses.py), KL, value loss and entropy
(test_verl_091_kl_value_entropy.py), rollout correction and validation statistics
(test_verl_091_rollout_validation.py). Overview and results: docs/algorithms/parity.md.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor

from stratarl.algo.advantages import ADVANTAGE_ESTIMATORS
from stratarl.algo.groups import group_ids_from_uids
from tests.parity.verl_091 import (
    ATOL,
    GROUP_SIZES,
    GROUP_SIZES_NO_SINGLETON,
    RESPONSE_LENGTH,
    check,
    normwise,
    response_mask,
    uids_for,
)

pytestmark = pytest.mark.parity

DTYPES = [torch.float32, torch.float64]
SEEDS = [0, 1, 2]

# --------------------------------------------------------------------------------- advantage estimators

GDPO_KEYS = ["format_reward", "accuracy_reward", "length_reward"]


def advantage_batch(seed: int, dtype: torch.dtype, group_sizes: tuple[int, ...] = GROUP_SIZES) -> dict:
    """Every field some estimator reads, for one seeded batch of N rows."""
    gen = torch.Generator().manual_seed(seed)
    uids = uids_for(group_sizes)
    n, t = len(uids), RESPONSE_LENGTH
    mask = response_mask(gen, n, t)
    last = (mask * torch.arange(t)).argmax(dim=-1)  # the reward sits on the last action token
    outcome = torch.randint(0, 2, (n,), generator=gen).float() + 0.5 * torch.randn(n, generator=gen)
    outcome[5] = outcome[4]  # the pair: equal outcomes, std 0
    rewards = torch.zeros(n, t)
    rewards[torch.arange(n), last] = outcome
    rewards[0] += 0.1 * torch.randn(t, generator=gen)  # a dense-reward row, padding included
    rewards[2, 0] = rewards[2, 0] + 1.0  # a second reward early in a row: the whole row is summed
    # OTB needs consistent π_t and Σπ²: sample them from real distributions over a small vocabulary.
    logits = 2.0 * torch.randn(n, t, 11, generator=gen)
    probs = torch.softmax(logits, dim=-1)
    tokens = torch.multinomial(probs.reshape(-1, 11), 1, generator=gen).reshape(n, t)
    components = {key: np.round(torch.randn(n, generator=gen).numpy(), 3) for key in GDPO_KEYS}
    return {
        "uids": uids,
        "token_level_rewards": rewards.to(dtype),
        "response_mask": mask.to(dtype),
        "values": torch.randn(n, t, generator=gen).to(dtype),
        "reward_baselines": torch.randn(n, generator=gen).to(dtype),
        "old_log_prob": probs.gather(-1, tokens[..., None]).squeeze(-1).log().to(dtype),
        "sum_pi_squared": probs.square().sum(-1).to(dtype),
        "rollout_is_weights": (0.5 + torch.rand(n, t, generator=gen)).to(dtype),
        "components": components,
    }


def _data_proto(verl: SimpleNamespace, batch: dict, *, with_is_weights: bool, remax: bool) -> Any:
    """The DataProto verl's trainer hands to compute_advantage (its own batch keys); `reward_baselines`
    only for ReMax, as verl's trainer forwards it to any estimator when present."""
    n, t = batch["response_mask"].shape
    prompt_length = 3
    response_attention = (
        torch.arange(t)[None, :] <= (batch["response_mask"] * torch.arange(t)).argmax(-1)[:, None]
    )
    tensors = {
        "token_level_rewards": batch["token_level_rewards"].clone(),
        "response_mask": batch["response_mask"].clone(),
        "values": batch["values"].clone(),
        "old_log_probs": batch["old_log_prob"].clone(),
        "sum_pi_squared": batch["sum_pi_squared"].clone(),
        "prompts": torch.ones(n, prompt_length, dtype=torch.long),
        "attention_mask": torch.cat([torch.ones(n, prompt_length), response_attention.float()], dim=1).long(),
    }
    if remax:
        tensors["reward_baselines"] = batch["reward_baselines"].clone()
    if with_is_weights:
        tensors["rollout_is_weights"] = batch["rollout_is_weights"].clone()
    non_tensors = {"uid": np.array(batch["uids"], dtype=object)}
    non_tensors.update(
        {key: np.array(list(value), dtype=object) for key, value in batch["components"].items()}
    )
    return verl.DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)


# name -> list of (our hyper-parameters, how verl gets the same setting). "trainer": through verl's
# compute_advantage with these keyword arguments (AlgoConfig fields under "config"); "direct": the
# registered function called with these keyword arguments (settings the trainer never forwards).
ADVANTAGE_CASES: dict[str, list[tuple[dict, str, dict]]] = {
    "gae": [({}, "trainer", {}), ({"gamma": 0.9, "lam": 0.8}, "trainer", {"gamma": 0.9, "lam": 0.8})],
    "grpo": [
        ({"norm_adv_by_std": True}, "trainer", {"norm_adv_by_std_in_grpo": True}),
        ({"norm_adv_by_std": False}, "trainer", {"norm_adv_by_std_in_grpo": False}),
    ],
    # verl's trainer does not forward norm_adv_by_std_in_grpo to grpo_vectorized: it always divides
    # by the std (docs/algorithms/advantages.md §5), whatever the trainer is given.
    "grpo_vectorized": [
        ({"norm_adv_by_std": True}, "trainer", {"norm_adv_by_std_in_grpo": False}),
        ({"norm_adv_by_std": False}, "direct", {"norm_adv_by_std_in_grpo": False}),
    ],
    "grpo_passk": [
        ({"norm_adv_by_std": True}, "trainer", {"config": {"norm_adv_by_std_in_grpo": True}}),
        ({"norm_adv_by_std": False}, "trainer", {"config": {"norm_adv_by_std_in_grpo": False}}),
    ],
    "gdpo": [
        ({}, "trainer", {"config": {"gdpo_reward_keys": GDPO_KEYS}}),
        (
            {"weights": [1.0, 0.5, 2.0]},
            "trainer",
            {"config": {"gdpo_reward_keys": GDPO_KEYS, "gdpo_reward_weights": [1.0, 0.5, 2.0]}},
        ),
        ({"norm_adv_by_std": False}, "direct", {"norm_adv_by_std_in_grpo": False}),
    ],
    "rloo": [({}, "trainer", {})],
    "rloo_vectorized": [({}, "trainer", {})],
    "opo": [({}, "trainer", {})],
    "gpg": [({}, "trainer", {}), ({"f_norm": 2.5}, "direct", {"f_norm": 2.5})],
    "reinforce_plus_plus_baseline": [({}, "trainer", {})],
    "reinforce_plus_plus": [({}, "trainer", {}), ({"gamma": 0.9}, "trainer", {"config": {"gamma": 0.9}})],
    "remax": [({}, "trainer", {})],
    "optimal_token_baseline": [
        ({}, "trainer", {}),
        ({"handle_zero_tail": False}, "direct", {"handle_zero_tail": False}),
    ],
    "tir_optimal_token_baseline": [
        ({}, "trainer", {}),
        ({"handle_zero_tail": False}, "direct", {"handle_zero_tail": False}),
    ],
}


def test_every_estimator_has_a_case() -> None:
    assert set(ADVANTAGE_CASES) == set(ADVANTAGE_ESTIMATORS)


def _verl_advantages(verl, name: str, batch: dict, route: str, settings: dict, is_weights: bool):
    settings = dict(settings)
    config = verl.AlgoConfig(**settings.pop("config", {}))
    data = _data_proto(verl, batch, with_is_weights=is_weights, remax=name == "remax")
    if route == "trainer":
        data = verl.ray_trainer.compute_advantage(data, name, config=config, **settings)
        return data.batch["advantages"], data.batch["returns"]
    fn = verl.core_algos.get_adv_estimator_fn(name)
    kwargs = {
        "token_level_rewards": data.batch["token_level_rewards"],
        "response_mask": data.batch["response_mask"],
    }
    kwargs["index"] = data.non_tensor_batch["uid"]
    if name == "gdpo":
        kwargs.update(config=verl.AlgoConfig(gdpo_reward_keys=GDPO_KEYS), batch=data.batch)
        kwargs["non_tensor_batch"] = data.non_tensor_batch
    if "optimal_token_baseline" in name:
        kwargs.update(old_log_probs=data.batch["old_log_probs"], sum_pi_squared=data.batch["sum_pi_squared"])
        kwargs["rollout_is_weights"] = data.batch.get("rollout_is_weights", None)
    return fn(**kwargs, **settings)


def _our_advantages(name: str, batch: dict, hyperparameters: dict, is_weights: bool):
    fields = {key: value.clone() for key, value in batch.items() if isinstance(value, Tensor)}
    fields["group"] = group_ids_from_uids(batch["uids"])
    fields["component_scores"] = batch["components"]
    if not is_weights:
        del fields["rollout_is_weights"]
    return ADVANTAGE_ESTIMATORS[name](fields, **hyperparameters)


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_advantage_estimator(verl, name: str, dtype: torch.dtype, seed: int) -> None:
    groups = GROUP_SIZES_NO_SINGLETON if name == "grpo_passk" else GROUP_SIZES
    batch = advantage_batch(seed, dtype, groups)
    weight_options = [False, True] if "optimal_token_baseline" in name else [False]
    for ours_hp, route, settings in ADVANTAGE_CASES[name]:
        for is_weights in weight_options:
            ours = _our_advantages(name, batch, ours_hp, is_weights)
            theirs = _verl_advantages(verl, name, batch, route, settings, is_weights)
            # float32 advantages are differences R − b whose summation order differs (verl's own grpo
            # loop and grpo_vectorized differ by 3.6e-7): compared normwise, max |Δ| ≤ 3e-7. GDPO casts
            # its components to float32 in verl and here, so it is compared the same way in float64.
            # float64: element by element, ≤ 1e-15, except float32 statistics inside verl: grpo's
            # singleton std torch.tensor(1.0) + ε (6e-8) and grpo_vectorized's group_mean_std (2e-7).
            loose = dtype == torch.float32 or name == "gdpo"
            for label, a, b in (("advantages", ours[0], theirs[0]), ("returns", ours[1], theirs[1])):
                atol = normwise(b) if loose else ATOL
                check(f"advantage/{name}", a, b, atol=atol, what=f"{label} {ours_hp} w={is_weights}")


def test_grpo_passk_group_of_one_raises_in_both(verl) -> None:
    batch = advantage_batch(0, torch.float32, GROUP_SIZES)
    with pytest.raises(ValueError):
        _verl_advantages(verl, "grpo_passk", batch, "trainer", {"config": {}}, False)
    with pytest.raises(ValueError):
        _our_advantages("grpo_passk", batch, {}, False)


def test_opo_all_empty_group_is_the_documented_departure(verl) -> None:
    """docs/algorithms/advantages.md §7: a group of ≥ 2 rows that are all empty gets baseline 0 here
    where verl computes 0/0. This is the only input excluded from the OPO comparison above (the
    default batch has no such group); here we show the difference is exactly that."""
    batch = advantage_batch(0, torch.float32, GROUP_SIZES)
    group_of_two = [i for i, uid in enumerate(batch["uids"]) if uid == "prompt-2"]
    batch["response_mask"][group_of_two] = 0.0
    ours, _ = _our_advantages("opo", batch, {}, False)
    theirs, _ = _verl_advantages(verl, "opo", batch, "trainer", {}, False)
    assert torch.isnan(theirs[group_of_two]).all() and (ours[group_of_two] == 0).all()
    others = [i for i in range(len(batch["uids"])) if i not in group_of_two]
    check("advantage/opo", ours[others], theirs[others], what="other rows")
