"""Layer 3, orchestration: the reward-model role — what builds it and the worker that holds it.

`RewardModelSpec` (picklable, built once from `reward.model.*`) says which model to load and how to
read it; `RewardModelWorker` holds the loaded model (`stratarl.reward.reward_model`) and scores
conversations. In one process the trainer calls the worker itself; with cluster.backend=ray a
`RankProcess` on the reward model's pool of the placement plan holds the same worker, built by the
same constructor, and `ray_reward_model.RayRewardModel` forwards each call to it. The trainer
calls both through `score_conversations` and `close`, and the watchdog through `arm_stack_dumps`
and `dump_stacks` (nothing to arm in one process).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

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
    """The reward model, loaded in the process that builds this (the trainer's, or a Ray rank's)."""

    def __init__(self, spec: RewardModelSpec) -> None:
        self.spec = spec
        self.model = load_reward_model(**asdict(spec))

    def score_conversations(self, conversations: Sequence[list[dict[str, Any]]]) -> Tensor:
        """[N] float32 scores of whole conversations (prompt messages, then the response)."""
        return self.model.score_conversations(list(conversations)).float()

    def arm_stack_dumps(self, folder: str | Path) -> list[str]:
        """Nothing to arm: the worker is this process, whose stacks the watchdog dumps itself."""
        return []

    def dump_stacks(self, folder: str | Path, header: str) -> list[str]:
        return []

    def close(self) -> None:
        pass
