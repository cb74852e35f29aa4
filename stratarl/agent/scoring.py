"""Layer 5, agent loops: score each episode the moment it finishes, while others still generate.

`StreamingScorer` is an `on_finished` callback for `AgentLoopRunner.run`: it decodes the finished
trajectory and submits it to a `ScoringPool` (separate processes, per-sample timeouts), so scoring
overlaps generation as in verl's reward loop. `result()` waits for the stragglers, writes each
reward into its trajectory (`reward`, `reward_extras`) and returns the batch's `RewardResult`.
The text scored is the action tokens only (special tokens dropped), as the trainer's reward phase
decodes; `include_observations=True` scores the whole response as verl's naive manager does.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

from stratarl.agent.trajectory import Trajectory
from stratarl.reward.batch_scorer import RewardResult
from stratarl.reward.process_pool import outcomes_to_result


def solution_text(tokenizer: Any, trajectory: Trajectory, *, include_observations: bool = False) -> str:
    """The response as text for a scorer: sampled tokens only, or every response token."""
    ids = [
        token
        for token, mask in zip(trajectory.response_ids, trajectory.response_mask, strict=True)
        if mask or include_observations
    ]
    return tokenizer.decode(ids, skip_special_tokens=True)


class StreamingScorer:
    """Submit finished trajectories to `pool` (a `ScoringPool` or a `RewardManager`: anything with
    `submit` and `max_examples`); `submitted_at[i]` is when row i went in (monotonic s)."""

    def __init__(self, pool: Any, tokenizer: Any, *, include_observations: bool = False) -> None:
        self.pool, self.tokenizer, self.include_observations = pool, tokenizer, include_observations
        self.futures: dict[int, Future] = {}
        self.trajectories: dict[int, Trajectory] = {}
        self.submitted_at: dict[int, float] = {}

    def __call__(self, index: int, trajectory: Trajectory) -> None:
        sample = trajectory.sample
        text = solution_text(self.tokenizer, trajectory, include_observations=self.include_observations)
        extra_info = dict(sample.get("extra_info") or {})
        extra_info["num_turns"] = trajectory.num_turns  # as verl passes it to reward functions
        self.futures[index] = self.pool.submit(
            sample.get("data_source", ""), text, sample.get("ground_truth"), extra_info
        )
        self.trajectories[index] = trajectory
        self.submitted_at[index] = time.monotonic()

    def result(self) -> RewardResult:
        """Wait for every submitted trajectory; rows in index order (0..N-1, all must be present)."""
        indices = sorted(self.futures)
        if indices != list(range(len(indices))):
            raise ValueError(f"StreamingScorer: rows {indices[:10]}... are not 0..N-1")
        outcomes = [self.futures[i].result() for i in indices]
        sources = [str(self.trajectories[i].sample.get("data_source", "")) for i in indices]
        result = outcomes_to_result(outcomes, sources, self.pool.max_examples)
        for i, outcome in zip(indices, outcomes, strict=True):
            self.trajectories[i].reward = outcome.score
            self.trajectories[i].reward_extras = dict(outcome.extras)
        return result
