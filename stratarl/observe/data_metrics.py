"""Cross-cutting: the per-step statistics of a batch, with verl's metric names.

`critic/score/*` (sequence scores), `critic/rewards/*`, `critic/advantages/*`, `critic/returns/*`
(over action tokens), `response_length/*` and `prompt_length/*` (with the share clipped at the
length limit), and `perf/*` throughput.
"""

from __future__ import annotations

import torch
from torch import Tensor

from stratarl.transport.data_proto import DataProto


def _stats(prefix: str, values: Tensor) -> dict[str, float]:
    if values.numel() == 0:
        return {}
    values = values.float()
    return {
        f"{prefix}/mean": values.mean().item(),
        f"{prefix}/max": values.max().item(),
        f"{prefix}/min": values.min().item(),
    }


def data_metrics(batch: DataProto, *, max_prompt_tokens: int | None = None) -> dict[str, float]:
    """Statistics of a trained batch (after the advantage phase). `prompt_length/clip_ratio` is the
    share of prompts at data.max_prompt_tokens (`max_prompt_tokens`; None: at the batch's padded
    prompt width, which is the longest prompt of the batch, so that share is never 0)."""
    response_mask = batch["response_mask"].bool()  # [N, T]
    max_response = response_mask.shape[1]
    response_length = response_mask.sum(-1).float()  # [N]
    prompt_mask = batch["attention_mask"][:, :-max_response].bool()  # [N, P]
    prompt_length = prompt_mask.sum(-1).float()
    metrics: dict[str, float] = {}
    if "token_level_scores" in batch:
        metrics |= _stats("critic/score", batch["token_level_scores"].sum(-1))
    if "token_level_rewards" in batch:
        metrics |= _stats("critic/rewards", batch["token_level_rewards"].sum(-1))
    for name in ("advantages", "returns", "values"):
        if name in batch:
            metrics |= _stats(f"critic/{name}", batch[name][response_mask])
    metrics |= _stats("response_length", response_length)
    metrics["response_length/clip_ratio"] = (response_length == max_response).float().mean().item()
    metrics["response/aborted_ratio"] = (response_length == 0).float().mean().item()
    metrics |= _stats("prompt_length", prompt_length)
    prompt_limit = prompt_mask.shape[1] if max_prompt_tokens is None else max_prompt_tokens
    metrics["prompt_length/clip_ratio"] = (prompt_length >= prompt_limit).float().mean().item()
    return metrics


def throughput_metrics(batch: DataProto, step_seconds: float, num_workers: int = 1) -> dict[str, float]:
    """`perf/total_num_tokens`, `perf/time_per_step`, `perf/throughput` (tokens / s / worker)."""
    total_tokens = int(batch["attention_mask"].sum())
    return {
        "perf/total_num_tokens": float(total_tokens),
        "perf/time_per_step": step_seconds,
        "perf/throughput": total_tokens / max(step_seconds, 1e-9) / num_workers,
    }


def group_signal_share(scores: Tensor, group: Tensor) -> float:
    """Share of groups whose scores are not all equal: the groups that carry a learning signal for
    group-relative estimators (a batch where this is 0 cannot move the policy)."""
    _, inverse = torch.unique(group, return_inverse=True)
    n_groups = int(inverse.max()) + 1
    lo = torch.full((n_groups,), float("inf")).scatter_reduce(0, inverse, scores.float(), "amin")
    hi = torch.full((n_groups,), float("-inf")).scatter_reduce(0, inverse, scores.float(), "amax")
    return (hi > lo).float().mean().item()
