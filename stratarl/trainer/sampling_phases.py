"""Layer 2, control flow: phases that decide *which* trajectories a step trains on.

DAPO's dynamic sampling (drop groups without learning signal, keep generating), ReMax's greedy
baseline rollout (the extra rollout its estimator declares by reading `reward_baselines`), and
PF-PPO's resampling by score after the advantage.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from stratarl.algo.groups import group_ids_from_uids
from stratarl.algo.policy_filtration import pf_ppo_resample
from stratarl.cluster.handles import PolicyHandle
from stratarl.rollout.interface import SamplingParams
from stratarl.transport.data_proto import DataProto
from stratarl.transport.field_checks import validate


def trajectory_metric(batch: DataProto, metric: str) -> torch.Tensor:
    """[N] the per-trajectory value named `metric`: `score` (Σ token_level_scores) or a column the
    reward phase wrote from the scorer's extra keys (e.g. `acc`)."""
    if metric == "score":
        return batch["token_level_scores"].sum(-1)
    if metric not in batch:
        raise KeyError(
            f"algorithm.filter_groups.metric={metric!r} is neither 'score' nor a reward key in the batch"
        )
    return torch.as_tensor(np.asarray(batch[metric], dtype=np.float64))


def keep_groups_with_signal(batch: DataProto, metric: str) -> tuple[DataProto, int]:
    """(the rows of groups whose `metric` varies, number of groups dropped). A group whose n samples
    all score the same gets zero group-relative advantage: it costs compute and teaches nothing."""
    values = trajectory_metric(batch, metric)
    group = group_ids_from_uids(batch["uid"])
    n_groups = int(group.max()) + 1
    lo = torch.full((n_groups,), float("inf"), dtype=values.dtype).scatter_reduce(0, group, values, "amin")
    hi = torch.full((n_groups,), float("-inf"), dtype=values.dtype).scatter_reduce(0, group, values, "amax")
    keep_group = hi > lo  # [G]
    rows = torch.nonzero(keep_group[group]).squeeze(-1)
    return batch.take(rows), int((~keep_group).sum())


def greedy_baselines(
    worker: PolicyHandle, batch: DataProto, n: int, sampling: SamplingParams, score_fn: Any
) -> DataProto:
    """ReMax: one greedy response per prompt, scored; its score is the baseline b of all n samples."""
    first_of_group = batch.take(torch.arange(0, len(batch), n))
    prompt_columns = [c for c in first_of_group.non_tensor_keys if c != "finish_reason"]
    first_of_group = first_of_group.select(prompt_columns)  # the prompt, without the sampled response
    greedy = first_of_group.union(worker.generate(first_of_group, SamplingParams(
        temperature=0.0, max_tokens=sampling.max_tokens, stop_token_ids=sampling.stop_token_ids,
    )))  # fmt: skip
    scored = score_fn(greedy)
    baselines = scored["token_level_scores"].sum(-1).repeat_interleave(n)  # [N]
    return batch.union(DataProto.from_dict({"reward_baselines": baselines}))


def resample_by_score(
    batch: DataProto, *, reweight_method: str, weight_pow: float, seed: int
) -> tuple[DataProto, dict[str, float]]:
    """PF-PPO (`algorithm.use_pf_ppo`): the N rows the update trains on, drawn with replacement by
    weights of Σ token_level_scores, each with the advantage computed on the whole batch (verl
    resamples at the end of its `compute_advantage`). Seeded per step, so a rerun draws the same rows."""
    validate(batch, reads=["token_level_scores", "advantages"], phase="advantage")
    scores = trajectory_metric(batch, "score")
    generator = torch.Generator(device=scores.device).manual_seed(seed)
    rows = pf_ppo_resample(
        scores=scores, reweight_method=reweight_method, weight_pow=weight_pow, generator=generator
    )
    return batch.take(rows), {"batch/pf_ppo_distinct_rows": float(rows.unique().numel())}


def sum_reward_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """Reward metrics of several generation rounds: failure counts add up, means are averaged."""
    keys = {key for part in parts for key in part}
    return {
        key: (sum if key.startswith("reward/failures/") else _mean)([p[key] for p in parts if key in p])
        for key in keys
    }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)
