"""Parity with verl 0.9.1 for steps that choose a batch's rows: PF-PPO's reweighted resampling
(`core_algos.compute_pf_ppo_reweight_data`, alone and inside `ray_trainer.compute_advantage` with gae,
the only estimator verl applies it with) and per-row repeat (`DataProto.sample_level_repeat`).

verl draws from torch's global generator; ours from the generator it is given. A CPU generator seeded
with s draws exactly what the global one draws after `torch.manual_seed(s)`, so the drawn rows are
compared exactly, for every method, not only their distribution.
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
from stratarl.algo.policy_filtration import PF_PPO_WEIGHTS, pf_ppo_resample
from stratarl.trainer.sampling_phases import resample_by_score
from stratarl.transport.data_proto import DataProto
from tests.parity.verl_091 import GROUP_SIZES, RESPONSE_LENGTH, check, response_mask, uids_for

pytestmark = pytest.mark.parity

DTYPES = [torch.float32, torch.float64]
SEEDS = [0, 1, 2]
# Outcome patterns: ties at the max and the min (binary, three levels), unique extremes
# (continuous), every row equal, every row 0 (pow weights all 1e-8), and negative scores.
PATTERNS = ["continuous", "binary", "three_levels", "all_equal", "all_zero", "negative"]
# (method, weight_pow): pow with several powers (0: uniform), the others with verl's default.
METHODS = [("pow", 2.0), ("pow", 1.0), ("pow", 0.5), ("pow", 0.0), ("max_min", 2.0), ("max_random", 2.0)]


def outcomes(gen: torch.Generator, pattern: str, n: int) -> Tensor:
    """[N] per-trajectory outcomes of one pattern."""
    return {
        "continuous": lambda: torch.randn(n, generator=gen),
        "binary": lambda: torch.randint(0, 2, (n,), generator=gen).float(),
        "three_levels": lambda: torch.randint(-1, 2, (n,), generator=gen).float() * 0.5,
        "all_equal": lambda: torch.full((n,), 0.7),
        "all_zero": lambda: torch.zeros(n),
        "negative": lambda: -torch.rand(n, generator=gen) - 0.1,
    }[pattern]()


def scored_batch(seed: int, dtype: torch.dtype, pattern: str) -> dict[str, Any]:
    """token_level_scores with each outcome on the last action token (one row dense), the mask,
    values for gae, and a `row` column that names each source row."""
    gen = torch.Generator().manual_seed(seed)
    uids = uids_for(GROUP_SIZES)
    n, t = len(uids), RESPONSE_LENGTH
    mask = response_mask(gen, n, t)
    last = (mask * torch.arange(t)).argmax(dim=-1)
    scores = torch.zeros(n, t)
    scores[torch.arange(n), last] = outcomes(gen, pattern, n)
    if pattern not in ("all_equal", "all_zero"):
        scores[0] += 0.1 * torch.randn(t, generator=gen)  # a dense row: the sum over T is the score
    return {
        "uids": uids,
        "token_level_scores": scores.to(dtype),
        "response_mask": mask.to(dtype),
        "values": torch.randn(n, t, generator=gen).to(dtype),
        "advantages": torch.randn(n, t, generator=gen).to(dtype),
        "row": torch.arange(n),
    }


def _tensors(batch: dict[str, Any], names: tuple[str, ...]) -> dict[str, Tensor]:
    return {name: batch[name].clone() for name in names}


def _verl_pf_ppo(verl: SimpleNamespace, batch: dict, method: str, weight_pow: float, seed: int) -> Any:
    names = ("token_level_scores", "response_mask", "advantages", "row")
    data = verl.DataProto.from_dict(
        tensors=_tensors(batch, names), non_tensors={"uid": np.array(batch["uids"], dtype=object)}
    )
    with torch.random.fork_rng(devices=[]):  # verl draws from the global generator
        torch.manual_seed(seed)
        return verl.core_algos.compute_pf_ppo_reweight_data(data, method, weight_pow)


@pytest.mark.parametrize(("method", "weight_pow"), METHODS)
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_pf_ppo_draws_the_rows_verl_draws(verl, method, weight_pow, pattern, dtype, seed) -> None:
    batch = scored_batch(seed, dtype, pattern)
    theirs = _verl_pf_ppo(verl, batch, method, weight_pow, seed)
    # the trainer's phase, on our DataProto
    columns = _tensors(batch, ("token_level_scores", "response_mask", "advantages", "row"))
    columns["response_mask"] = columns["response_mask"].long()  # our field contract: 0/1 integers
    ours_batch = DataProto.from_columns(columns | {"uid": batch["uids"]})
    ours, metrics = resample_by_score(ours_batch, reweight_method=method, weight_pow=weight_pow, seed=seed)
    what = f"{pattern} p={weight_pow}"
    assert ours["row"].tolist() == theirs.batch["row"].tolist(), what
    for name in ("token_level_scores", "response_mask", "advantages"):
        check(f"pf_ppo/{method}", ours[name], theirs.batch[name], atol=0, rtol=0, what=f"{name} {what}")
    assert list(ours["uid"]) == list(theirs.non_tensor_batch["uid"])
    assert metrics["batch/pf_ppo_distinct_rows"] == len(set(theirs.batch["row"].tolist()))


@pytest.mark.parametrize("method", sorted(PF_PPO_WEIGHTS))
@pytest.mark.parametrize("seed", SEEDS)
def test_pf_ppo_on_a_batch_of_one(verl, method, seed) -> None:
    whole = scored_batch(seed, torch.float32, "continuous")
    batch = {k: v[:1] for k, v in whole.items()}  # the first row alone
    theirs = _verl_pf_ppo(verl, batch, method, 2.0, seed)
    gen = torch.Generator().manual_seed(seed)
    rows = pf_ppo_resample(scores=batch["token_level_scores"].sum(-1), reweight_method=method, generator=gen)
    assert rows.tolist() == theirs.batch["row"].tolist() == [0]


@pytest.mark.parametrize("method", sorted(PF_PPO_WEIGHTS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_pf_ppo_inside_compute_advantage_with_gae(verl, method, dtype, seed) -> None:
    """verl's trainer route: gae's advantages and returns on the whole batch, then the resampling.
    Ours composes the registered estimator with `pf_ppo_resample` the same way."""
    batch = scored_batch(seed, dtype, "three_levels")
    tensors = _tensors(batch, ("token_level_scores", "response_mask", "values", "row"))
    tensors["token_level_rewards"] = batch["token_level_scores"].clone()
    data = verl.DataProto.from_dict(
        tensors=tensors, non_tensors={"uid": np.array(batch["uids"], dtype=object)}
    )
    config = verl.AlgoConfig(use_pf_ppo=True, pf_ppo={"reweight_method": method, "weight_pow": 2.0})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        theirs = verl.ray_trainer.compute_advantage(data, "gae", gamma=0.9, lam=0.8, config=config)

    fields = {
        "token_level_rewards": batch["token_level_scores"].clone(),
        "response_mask": batch["response_mask"],
        "values": batch["values"],
        "group": group_ids_from_uids(batch["uids"]),
    }
    advantages, returns = ADVANTAGE_ESTIMATORS["gae"](fields, gamma=0.9, lam=0.8)
    gen = torch.Generator().manual_seed(seed)
    rows = pf_ppo_resample(
        scores=batch["token_level_scores"].sum(-1), reweight_method=method, weight_pow=2.0, generator=gen
    )
    assert rows.tolist() == theirs.batch["row"].tolist()
    check("pf_ppo/inside_gae", advantages[rows], theirs.batch["advantages"], what=f"advantages {method}")
    check("pf_ppo/inside_gae", returns[rows], theirs.batch["returns"], what=f"returns {method}")


def test_an_unknown_method_raises_in_both(verl) -> None:
    batch = scored_batch(0, torch.float32, "binary")
    with pytest.raises(ValueError):
        _verl_pf_ppo(verl, batch, "maxmin", 2.0, 0)
    with pytest.raises(ValueError):
        pf_ppo_resample(scores=batch["token_level_scores"].sum(-1), reweight_method="maxmin")


# ------------------------------------------------------------------------------------ per-row repeat

REPEATS = {
    "mixed": [2, 0, 3, 1, 1, 4],
    "all_ones": [1, 1, 1, 1, 1, 1],
    "all_three": [3, 3, 3, 3, 3, 3],
    "zeros_around": [0, 0, 5, 0, 0, 1],
}


def _repeat_batch(seed: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    n = 6
    return {
        "responses": torch.randint(0, 100, (n, 5), generator=gen),
        "response_mask": response_mask(gen, n, 5),
        "advantages": torch.randn(n, 5, generator=gen, dtype=torch.float64),
        "uid": np.array([f"prompt-{i // 2}" for i in range(n)], dtype=object),
        "extra_info": np.array([{"index": i} for i in range(n)], dtype=object),
    }


@pytest.mark.parametrize("case", sorted(REPEATS))
@pytest.mark.parametrize("as_type", ["list", "tuple", "tensor", "ndarray"])
def test_repeat_rows_is_sample_level_repeat(verl, case, as_type) -> None:
    columns = _repeat_batch(seed=len(case))
    tensors = {k: v.clone() for k, v in columns.items() if isinstance(v, Tensor)}
    non_tensors = {k: v.copy() for k, v in columns.items() if not isinstance(v, Tensor)}
    meta = {"global_step": 3, "temperature": 1.0}
    times = {"list": list, "tuple": tuple, "tensor": torch.tensor, "ndarray": np.array}[as_type](
        REPEATS[case]
    )
    theirs = verl.DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta)
    theirs = theirs.sample_level_repeat(times)
    ours = DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta).repeat_rows(times)
    assert len(ours) == len(theirs) == sum(REPEATS[case])
    for name in tensors:
        check("sample_level_repeat", ours[name], theirs.batch[name], atol=0, rtol=0, what=f"{name} {case}")
        assert ours[name].dtype == theirs.batch[name].dtype
    for name in non_tensors:
        assert list(ours[name]) == list(theirs.non_tensor_batch[name]), name
    assert ours.meta_info == theirs.meta_info
