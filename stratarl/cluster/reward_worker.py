"""Layer 3, orchestration: the reward-model role — in this process, or as a Ray actor of its own.

`RewardModelSpec` (picklable, built once from `reward.model.*`) says which model to load and how to
read it; `RewardModelWorker` holds the loaded model (`stratarl.reward.reward_model`) and scores
conversations. With cluster.backend=ray, `RayRewardModel` starts one actor that holds the same
worker (the same construction code) with its own CPUs and GPUs, and forwards each call to it; the
trainer calls both through `score_conversations` and `close`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from stratarl.reward.reward_model import load_reward_model


@dataclass(frozen=True)
class RewardModelSpec:
    """What `load_reward_model` needs; `device` is where its forward runs."""

    path: str
    kind: str
    tokenizer_path: str = ""
    dtype: str = "float32"
    batch_size: int = 8
    judge_template: str = ""
    judge_yes: str = "yes"
    judge_no: str = "no"
    device: str = "cpu"


class RewardModelWorker:
    """The reward model in this process."""

    def __init__(self, spec: RewardModelSpec) -> None:
        self.spec = spec
        self.model = load_reward_model(**asdict(spec))

    def score_conversations(self, conversations: Sequence[list[dict[str, Any]]]) -> Tensor:
        """[N] float32 scores of whole conversations (prompt messages, then the response)."""
        return self.model.score_conversations(list(conversations)).float()

    def close(self) -> None:
        pass


class _RewardModelHost:
    """The body of the Ray actor: one thread of torch compute, one `RewardModelWorker`."""

    def __init__(self, spec: RewardModelSpec, threads: int) -> None:
        torch.set_num_threads(threads)
        self.worker = RewardModelWorker(spec)

    def score_conversations(self, conversations: list[list[dict[str, Any]]]) -> Tensor:
        return self.worker.score_conversations(conversations)


class RayRewardModel:
    """A handle to the reward model's Ray actor (joins the Ray connection the policy made)."""

    def __init__(
        self, spec: RewardModelSpec, *, num_cpus: float, num_gpus: float, threads: int, call_timeout_s: float
    ) -> None:
        import ray

        if not ray.is_initialized():
            raise RuntimeError("the reward model's Ray actor needs a Ray connection: build the policy first")
        self.call_timeout_s = call_timeout_s
        actor = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus)(_RewardModelHost)
        self.actor = actor.options(name=None, max_restarts=0).remote(spec, threads)
        # Loading errors surface here, before training starts, not at the first reward phase.
        ray.get(self.actor.__ray_ready__.remote(), timeout=call_timeout_s)

    def score_conversations(self, conversations: Sequence[list[dict[str, Any]]]) -> Tensor:
        import ray

        ref = self.actor.score_conversations.remote(list(conversations))
        return ray.get(ref, timeout=self.call_timeout_s)

    def close(self) -> None:
        import ray

        if ray.is_initialized():
            ray.kill(self.actor)
