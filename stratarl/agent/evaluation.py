"""Layer 5, agent loops: run episodes and score them in one call — for validation and quick checks.

`run_and_score` drives the episodes with an `AgentLoopRunner`, scores each one as it finishes
(in a `ScoringPool` when given, else in-process after the run), and returns the trajectories, the
`RewardResult` and one flat metrics dict: the agent metrics (`agent_metrics`), the reward's
(`reward/*`), and `val/score/mean`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from stratarl.agent.metrics import agent_metrics
from stratarl.agent.runner import AgentLoopRunner
from stratarl.agent.scoring import StreamingScorer, solution_text
from stratarl.agent.trajectory import Trajectory
from stratarl.reward.batch_scorer import RewardResult, score_batch
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
    compute_score: Callable[..., Any] = default_compute_score,
    seed: int | None = None,
) -> tuple[list[Trajectory], RewardResult, dict[str, float]]:
    """Episodes for `rows`, each scored with the data source's scorer; rewards written into them."""
    if pool is not None:
        scorer = StreamingScorer(pool, tokenizer)
        trajectories = runner.run_sync(rows, sampling, seed=seed, on_finished=scorer)
        result = scorer.result()
    else:
        trajectories = runner.run_sync(rows, sampling, seed=seed)
        result = score_batch(
            [str(t.sample.get("data_source", "")) for t in trajectories],
            [solution_text(tokenizer, t) for t in trajectories],
            [t.sample.get("ground_truth") for t in trajectories],
            [dict(t.sample.get("extra_info") or {}, num_turns=t.num_turns) for t in trajectories],
            compute_score=compute_score,
        )
        for i, (t, score) in enumerate(zip(trajectories, result.scores.tolist(), strict=True)):
            t.reward = score
            t.reward_extras = {k: v[i] for k, v in result.extra.items()}
    metrics = {**agent_metrics(trajectories), **result.metrics()}
    metrics["val/score/mean"] = float(result.scores.mean()) if len(trajectories) else 0.0
    return trajectories, result, metrics
