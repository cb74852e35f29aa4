"""Layer 5, agent loops: run episodes and score them in one call — for validation and quick checks.

`run_and_score` drives the episodes with an `AgentLoopRunner`, scores each one as it finishes
(with a `RewardManager`'s rule scorer or a `ScoringPool` when given, else a plain function
in-process after the run), and returns the trajectories, the `RewardResult` and one flat metrics
dict: the agent metrics (`agent_metrics`), the reward's (`reward/*`), and `val/score/mean`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from stratarl.agent.metrics import agent_metrics
from stratarl.agent.runner import AgentLoopRunner
from stratarl.agent.scoring import StreamingScorer, solution_text
from stratarl.agent.trajectory import Trajectory
from stratarl.reward.batch_scorer import RewardResult, score_batch
from stratarl.reward.manager import RewardInputs, RewardManager
from stratarl.reward.process_pool import ScoringPool
from stratarl.reward.registry import default_compute_score
from stratarl.rollout.interface import SamplingParams


def run_and_score(
    runner: AgentLoopRunner,
    rows: Sequence[dict[str, Any]],
    sampling: SamplingParams,
    tokenizer: Any,
    *,
    pool: ScoringPool | None = None,
    compute_score: Callable[..., Any] | RewardManager = default_compute_score,
    seed: int | None = None,
) -> tuple[list[Trajectory], RewardResult, dict[str, float]]:
    """Episodes for `rows`, each scored with the data source's scorer (all of a `RewardManager`'s
    sources when `compute_score` is one); rewards written into them."""
    manager = compute_score if isinstance(compute_score, RewardManager) else None
    if manager is not None and not manager.streams_rule:
        trajectories = runner.run_sync(rows, sampling, seed=seed)
        inputs = _inputs(tokenizer, trajectories)
        result = manager.combine(manager.score_rule(inputs), inputs)
        _write_rewards(trajectories, result)
    elif pool is not None or manager is not None:
        scorer = StreamingScorer(pool or manager, tokenizer)
        trajectories = runner.run_sync(rows, sampling, seed=seed, on_finished=scorer)
        result = scorer.result()
        if manager is not None:
            result = manager.combine(result, _inputs(tokenizer, trajectories))
            _write_rewards(trajectories, result)
    else:
        trajectories = runner.run_sync(rows, sampling, seed=seed)
        result = score_batch(
            [str(t.sample.get("data_source", "")) for t in trajectories],
            [solution_text(tokenizer, t) for t in trajectories],
            [t.sample.get("ground_truth") for t in trajectories],
            [dict(t.sample.get("extra_info") or {}, num_turns=t.num_turns) for t in trajectories],
            compute_score=compute_score,
        )
        _write_rewards(trajectories, result)
    metrics = {**agent_metrics(trajectories), **result.metrics()}
    metrics["val/score/mean"] = float(result.scores.mean()) if len(trajectories) else 0.0
    return trajectories, result, metrics


def _inputs(tokenizer: Any, trajectories: Sequence[Trajectory]) -> RewardInputs:
    """The reward sources' inputs for finished episodes (the whole conversation for a reward model)."""
    texts = [solution_text(tokenizer, t) for t in trajectories]
    return RewardInputs(
        data_sources=[str(t.sample.get("data_source", "")) for t in trajectories],
        texts=texts,
        ground_truths=[t.sample.get("ground_truth") for t in trajectories],
        extra_infos=[dict(t.sample.get("extra_info") or {}, num_turns=t.num_turns) for t in trajectories],
        conversations=[
            [*_prompt_messages(t), {"role": "assistant", "content": text}]
            for t, text in zip(trajectories, texts, strict=True)
        ],
        response_lengths=torch.tensor([len(t.response_ids) for t in trajectories], dtype=torch.int64),
    )


def _prompt_messages(trajectory: Trajectory) -> list[dict[str, Any]]:
    """The messages before the first assistant turn: the prompt, as the trainer's reward phase reads it."""
    roles = [m.get("role") for m in trajectory.messages]
    end = roles.index("assistant") if "assistant" in roles else len(roles)
    return [dict(m) for m in trajectory.messages[:end]]


def _write_rewards(trajectories: Sequence[Trajectory], result: RewardResult) -> None:
    for i, (t, score) in enumerate(zip(trajectories, result.scores.tolist(), strict=True)):
        t.reward = score
        t.reward_extras = {k: v[i] for k, v in result.extra.items()}
