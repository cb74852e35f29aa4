"""Layer 5, rewards: the reward manager — rule scorers, a reward model and a remote reward, summed.

    score_i = w_rule · rule_i + w_model · rm_i + w_remote · remote_i          (the sources configured)
    score_i = failure_score                     when a source failed for sample i (reason counted)
    score_i += R_len(|y_i|)                     DAPO's overlong penalty, when on (`overlong`)

The rule scorer is `in_process` (fast, no deadline) or a `ScoringPool` (worker processes, one
deadline per call; the default). The reward model is anything with `score_conversations(list of
messages) -> [N]` — an in-process worker or a Ray actor's handle from `cluster.reward_worker` —
and the remote reward a `RemoteScorer` called from threads, with its own timeout and retries.
Each source's score is kept as an extra (`rule_score`, `rm_score`, `remote_score`) when more than
one is on. `submit` (one rule score, a `Future`) serves streaming rewards; `combine` then adds the
other sources to what the stream scored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from stratarl.reward.batch_scorer import RewardResult, collect_outcomes, score_batch
from stratarl.reward.overlong import with_overlong_penalty
from stratarl.reward.process_pool import ScoringPool
from stratarl.reward.remote import RemoteScorer
from stratarl.reward.score_call import ScoreOutcome, call_scorer


class ConversationScorer(Protocol):
    """A reward model's handle: in the trainer's process or a Ray actor's (`cluster.reward_worker`)."""

    def score_conversations(self, conversations: Sequence[list[dict[str, Any]]]) -> Tensor: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class RewardInputs:
    """N samples to score: what rule scorers read, what a reward model reads (the prompt's messages
    and the response as the last assistant message), and each response's length in tokens."""

    data_sources: list[str]
    texts: list[str]
    ground_truths: list[Any]
    extra_infos: list[dict | None]
    conversations: list[list[dict[str, Any]]]
    response_lengths: Tensor  # [N] int64


@dataclass(frozen=True)
class OverlongSettings:
    max_response_length: int
    buffer_length: int
    penalty_factor: float


class InProcessScorer:
    """The rule scorer in the trainer's own process (`reward.in_process`): no deadline, no isolation."""

    def __init__(self, compute_score: Callable[..., Any], max_examples: int = 3) -> None:
        self.compute_score, self.max_examples = compute_score, max_examples

    def score_batch(self, data_sources, solution_strs, ground_truths, extra_infos=None) -> RewardResult:
        return score_batch(
            data_sources, solution_strs, ground_truths, extra_infos, compute_score=self.compute_score
        )

    def submit(
        self, data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
    ) -> Future:
        future: Future = Future()
        future.set_result(
            call_scorer(self.compute_score, data_source, solution_str, ground_truth, extra_info)
        )
        return future

    def close(self) -> None:
        pass


class RewardManager:
    """The sources of one run's reward, built once (`trainer.scoring.build_reward`)."""

    def __init__(
        self,
        rule: InProcessScorer | ScoringPool | None,
        *,
        rule_weight: float = 1.0,
        model: ConversationScorer | None = None,
        model_weight: float = 1.0,
        remote: RemoteScorer | None = None,
        remote_weight: float = 1.0,
        remote_concurrency: int = 8,
        overlong: OverlongSettings | None = None,
        failure_score: float = 0.0,
    ) -> None:
        if rule is None and model is None and remote is None:
            raise ValueError("a RewardManager needs at least one source: rule, model or remote")
        self.rule, self.rule_weight = rule, rule_weight
        self.model, self.model_weight = model, model_weight
        self.remote, self.remote_weight, self.remote_concurrency = remote, remote_weight, remote_concurrency
        self.overlong, self.failure_score = overlong, failure_score

    @classmethod
    def in_process(cls, compute_score: Callable[..., Any]) -> RewardManager:
        """A plain scorer function, called in this process (tests, quick evaluation)."""
        return cls(InProcessScorer(compute_score))

    @property
    def streams_rule(self) -> bool:
        return self.rule is not None

    def submit(
        self, data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
    ) -> Future:
        """One rule score as a Future of a `ScoreOutcome` (streaming rewards)."""
        assert self.rule is not None, "no rule scorer to stream to (reward.rule_weight=0)"
        return self.rule.submit(data_source, solution_str, ground_truth, extra_info)

    @property
    def max_examples(self) -> int:
        return self.rule.max_examples if self.rule is not None else 3

    def score(self, inputs: RewardInputs) -> RewardResult:
        """All sources for N samples."""
        return self.combine(self.score_rule(inputs), inputs)

    def score_rule(self, inputs: RewardInputs) -> RewardResult:
        if self.rule is None:
            n = len(inputs.texts)
            return collect_outcomes([ScoreOutcome(0.0) for _ in range(n)], inputs.data_sources)
        return self.rule.score_batch(
            inputs.data_sources, inputs.texts, inputs.ground_truths, inputs.extra_infos
        )

    def combine(self, rule: RewardResult, inputs: RewardInputs) -> RewardResult:
        """`rule` (scored here or while streaming) plus the other sources, failures and the penalty."""
        parts: dict[str, Tensor] = {}
        result = rule
        if self.rule is not None:
            parts["rule_score"] = rule.scores * self.rule_weight
        if self.model is not None:
            parts["rm_score"] = (
                self.model.score_conversations(inputs.conversations).float() * self.model_weight
            )
        if self.remote is not None:
            remote = self._score_remote(inputs)
            parts["remote_score"] = remote.scores * self.remote_weight
            result = _merge_failures(result, remote, prefix="remote_")
        total = torch.stack(list(parts.values())).sum(0)  # [N]
        extra = dict(result.extra)
        if len(parts) > 1 or self.rule is None:
            extra |= {key: value.tolist() for key, value in parts.items()}
        result = dataclasses.replace(result, scores=total, extra=extra).with_failure_score(self.failure_score)
        if self.overlong is not None:
            result = with_overlong_penalty(
                result,
                inputs.response_lengths,
                max_response_length=self.overlong.max_response_length,
                buffer_length=self.overlong.buffer_length,
                penalty_factor=self.overlong.penalty_factor,
            )
        return result

    def _score_remote(self, inputs: RewardInputs) -> RewardResult:
        """The remote reward of N samples from `remote_concurrency` threads. Each request has its
        socket timeout; the batch as a whole has `remote_deadline_s`, past which a sample still
        waiting (a DNS lookup, which no socket timeout covers) is a `timeout`."""
        remote = self.remote
        assert remote is not None
        jobs = zip(inputs.data_sources, inputs.texts, inputs.ground_truths, inputs.extra_infos, strict=True)
        threads = ThreadPoolExecutor(max_workers=self.remote_concurrency, thread_name_prefix="remote-reward")
        futures = [threads.submit(call_scorer, remote, *job) for job in jobs]
        deadline = remote_deadline_s(remote, len(futures), self.remote_concurrency)
        wait(futures, timeout=deadline)
        threads.shutdown(wait=False, cancel_futures=True)
        late = ScoreOutcome(0.0, {}, "timeout", f"no answer within the batch's {deadline:.0f} s")
        outcomes = [f.result() if f.done() and not f.cancelled() else late for f in futures]
        return collect_outcomes(outcomes, inputs.data_sources, self.max_examples)

    def close(self) -> None:
        if self.rule is not None:
            self.rule.close()
        if self.model is not None:
            self.model.close()


def remote_deadline_s(remote: RemoteScorer, n: int, concurrency: int) -> float:
    """The longest N remote calls can take when each behaves: every attempt times out, with the
    backoffs between attempts, in ceil(N / concurrency) waves, plus the rate limit's N / rate."""
    per_call = sum(
        remote.timeout_s + min(remote.backoff_s * 2**k, 60.0) for k in range(remote.max_retries + 1)
    )
    return -(-n // concurrency) * per_call + n / remote.requests_per_second + 5.0


def as_reward_manager(scorer: RewardManager | Callable[..., Any]) -> RewardManager:
    """The manager itself, or a plain scorer function wrapped to run in this process."""
    return scorer if isinstance(scorer, RewardManager) else RewardManager.in_process(scorer)


def _merge_failures(result: RewardResult, other: RewardResult, *, prefix: str) -> RewardResult:
    """`result` with `other`'s failures added under `prefix` (a sample failed if either failed)."""
    failures = dict(result.failures)
    for reason, count in other.failures.items():
        failures[prefix + reason] = failures.get(prefix + reason, 0) + count
    samples = [
        mine if mine is not None else (prefix + theirs if theirs is not None else None)
        for mine, theirs in zip(result.sample_failures, other.sample_failures, strict=True)
    ]
    messages = [  # the message of the failure a sample keeps
        mine_text if mine is not None else theirs_text
        for mine, mine_text, theirs_text in zip(
            result.sample_failures, result.sample_messages, other.sample_messages, strict=True
        )
    ]
    return dataclasses.replace(
        result,
        failures=failures,
        failure_examples=[*result.failure_examples, *other.failure_examples][:6],
        sample_failures=samples,
        sample_messages=messages,
    )
