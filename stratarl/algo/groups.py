"""Layer 6, RL math: groups of trajectories that share a prompt, and statistics per group.

A group id is a [N] int64 tensor with values 0..G-1; trajectories sampled from the same prompt
(verl's `uid`) share one id. Group-relative estimators (GRPO, RLOO, OPO, ...) and the optimal
token baseline reduce over these ids with scatter operations instead of Python loops.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

import torch
from torch import Tensor


def group_ids_from_uids(uids: Iterable[Hashable]) -> Tensor:
    """[N] int64 group ids from per-trajectory prompt ids (a numpy array of str/object, a list, ...).

    Equal uids get equal ids; ids are numbered 0..G-1 in order of first appearance, so group 0 is
    the prompt of the first row. Numbers are labels too: uids [7, 7, 3] give ids [0, 0, 1].
    """
    first_seen: dict[Hashable, int] = {}
    ids = [first_seen.setdefault(uid, len(first_seen)) for uid in _as_hashables(uids)]
    return torch.tensor(ids, dtype=torch.int64)


def _as_hashables(uids: Iterable[Hashable]) -> list[Hashable]:
    """Rows as plain Python values: numpy/torch scalars become their `.item()` so 7 and np.int64(7) match."""
    if isinstance(uids, Tensor):
        return uids.reshape(-1).tolist()
    return [uid.item() if hasattr(uid, "item") else uid for uid in uids]


def check_group(group: Tensor, num_rows: int, name: str = "group") -> None:
    """Raise ValueError unless `group` is a [num_rows] integer tensor of ids ≥ 0."""
    if not isinstance(group, Tensor) or group.dim() != 1 or group.shape[0] != num_rows:
        shape = tuple(group.shape) if isinstance(group, Tensor) else type(group).__name__
        raise ValueError(f"{name} must be a [N={num_rows}] tensor of group ids, got {shape}")
    if group.dtype.is_floating_point or group.dtype.is_complex or group.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer group ids, got dtype {group.dtype}")
    if num_rows and int(group.min()) < 0:
        raise ValueError(f"{name} ids must be ≥ 0, got {int(group.min())}")


def num_groups(group: Tensor) -> int:
    """G = max id + 1 (0 for an empty batch). Ids need not be contiguous; unused ids form empty groups."""
    return int(group.max()) + 1 if group.numel() else 0


def group_sum(values: Tensor, group: Tensor) -> Tensor:
    """Σ_{i∈g} values_i for every group g: [N, ...] -> [G, ...]."""
    out = values.new_zeros((num_groups(group), *values.shape[1:]))
    return out.index_add(0, group.to(values.device), values)


def group_count(group: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """n_g, the number of rows in each group: [N] -> [G]."""
    return group_sum(torch.ones(group.shape[0], dtype=dtype, device=group.device), group)


def group_mean(values: Tensor, group: Tensor) -> Tensor:
    """μ_g = Σ_{i∈g} values_i / n_g, per row: [N] -> [N] (each row gets its own group's mean)."""
    count = group_count(group, values.dtype).to(values.device)
    return (group_sum(values, group) / count.clamp_min(1))[group.to(values.device)]


def group_std(values: Tensor, group: Tensor) -> Tensor:
    """Unbiased (Bessel) standard deviation of each row's group, per row: [N] -> [N].

    σ_g = sqrt(Σ_{i∈g} (x_i − μ_g)² / (n_g − 1)), the same estimate as `torch.std`. A group of one
    has no spread to measure and gets σ = 0 here; estimators choose their own convention for it.
    """
    index = group.to(values.device)
    centered = values - group_mean(values, group)
    count = group_count(group, values.dtype).to(values.device)
    variance = group_sum(centered * centered, group) / (count - 1).clamp_min(1)
    return variance.sqrt()[index]


def group_max(values: Tensor, group: Tensor) -> Tensor:
    """max_{i∈g} values_i for every group: [N] -> [G] (the dtype's lowest value for an unused id)."""
    return _group_extreme(values, group, "amax")


def group_min(values: Tensor, group: Tensor) -> Tensor:
    """min_{i∈g} values_i for every group: [N] -> [G] (the dtype's highest value for an unused id)."""
    return _group_extreme(values, group, "amin")


def _group_extreme(values: Tensor, group: Tensor, reduce: str) -> Tensor:
    """Scatter max/min, starting from the identity of the reduction (±inf, or the integer extremes)."""
    if values.dtype.is_floating_point:
        start = -torch.inf if reduce == "amax" else torch.inf
    else:
        start = torch.iinfo(values.dtype).min if reduce == "amax" else torch.iinfo(values.dtype).max
    out = values.new_full((num_groups(group),), start)
    return out.scatter_reduce(0, group.to(values.device), values, reduce=reduce)


def group_size(group: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """n_g of each row's group, per row: [N] -> [N]."""
    return group_count(group, dtype)[group]


def share_of_groups_with_signal(accuracy: float, n: int) -> float:
    """The expected share of groups whose n samples do not all score alike, when each sample is right
    with probability p (a 0/1 reward):  1 − pⁿ − (1 − p)ⁿ.

    A group-relative estimator learns only from such groups (all right or all wrong: every advantage
    is 0). At p = 0.04 and n = 8 it is 0.28; at p = 0.5, 0.99.
    """
    p = min(max(accuracy, 0.0), 1.0)
    return 1.0 - p**n - (1.0 - p) ** n
