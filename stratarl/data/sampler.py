"""Layer 5, data: a seeded, resumable sampler of prompt indices, one batch of B prompts per step.

Epoch e visits a permutation drawn from (seed, e) alone, so any position can be rebuilt from
(epoch, batch_in_epoch) without replaying earlier epochs. After the last batch of an epoch the
state moves to (e + 1, 0) at once: a checkpoint taken exactly at an epoch boundary therefore
resumes with the whole next epoch. (verl #7401: restoring an exhausted loader state at the
boundary made the resumed run train 0 steps.)
"""

from __future__ import annotations

from typing import Any

import numpy as np


class PromptSampler:
    """Batches of dataset indices: `next_batch()` gives the B indices of the next step."""

    def __init__(
        self, num_items: int, *, batch_size: int, seed: int, shuffle: bool = True, drop_last: bool = True
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size (prompts per step) must be >= 1, got {batch_size}")
        if num_items < 1:
            raise ValueError("the dataset is empty")
        if num_items < batch_size and drop_last:
            raise ValueError(
                f"{num_items} prompts cannot fill one batch of {batch_size} prompts with drop_last=True"
            )
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.num_items = num_items
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.epoch = 0
        self.batch_in_epoch = 0
        self._order: np.ndarray | None = None  # permutation of the current epoch, built lazily

    @property
    def batches_per_epoch(self) -> int:
        """Steps per epoch. With drop_last, each epoch skips the last num_items % batch_size of its order."""
        full, rest = divmod(self.num_items, self.batch_size)
        return full if self.drop_last or rest == 0 else full + 1

    @property
    def unused_per_epoch(self) -> int:
        """Prompts an epoch leaves out (drop_last: the last num_items % batch_size of its order; the
        same rows every epoch when not shuffled)."""
        return self.num_items % self.batch_size if self.drop_last else 0

    def epoch_order(self, epoch: int) -> np.ndarray:
        """[num_items] the order in which epoch `epoch` visits the dataset."""
        if not self.shuffle:
            return np.arange(self.num_items)
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_items)

    def next_batch(self) -> list[int]:
        """The next B dataset indices (fewer only for the last batch of an epoch when drop_last=False)."""
        if self._order is None:
            self._order = self.epoch_order(self.epoch)
        start = self.batch_in_epoch * self.batch_size
        batch = self._order[start : start + self.batch_size].tolist()
        self.batch_in_epoch += 1
        if self.batch_in_epoch >= self.batches_per_epoch:
            self.epoch, self.batch_in_epoch, self._order = self.epoch + 1, 0, None
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "num_items": self.num_items,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where `state` was taken; raises if it describes a different sampler."""
        for key in ("num_items", "batch_size", "seed", "shuffle", "drop_last"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"sampler state has {key}={state[key]!r} but this sampler has {getattr(self, key)!r}; "
                    "resuming would visit different prompts"
                )
        epoch, batch_in_epoch = int(state["epoch"]), int(state["batch_in_epoch"])
        if not 0 <= batch_in_epoch <= self.batches_per_epoch:
            raise ValueError(f"batch_in_epoch={batch_in_epoch} outside 0..{self.batches_per_epoch}")
        if batch_in_epoch == self.batches_per_epoch:  # an exhausted epoch: the next one starts whole
            epoch, batch_in_epoch = epoch + 1, 0
        self.epoch, self.batch_in_epoch, self._order = epoch, batch_in_epoch, None
