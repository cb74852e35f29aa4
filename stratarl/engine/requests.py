"""Layer 5, training engine: the options of one engine call, as one frozen value each.

An update's options (`UpdateRequest`) and a scoring forward's (`ScoreRequest`) are declared here
once; every layer above passes the same object down — the trainer's phases build it, the handles,
worker groups and workers hand it on (`cluster/handles.py` re-exports both for the trainer), and a
Ray rank receives it pickled, unchanged. A worker group that splits an update over D ranks sends
each rank the request with its local mini-batch size (`dataclasses.replace`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class UpdateRequest:
    """One training step of an actor or a critic (`TrainingEngine.update`).

    mini_batch_size: rows per optimizer step (the global size at a worker group, this rank's below it).
    epochs: passes over the batch. shuffle_seed: None keeps the row order; an int shuffles every
    epoch with one seeded generator. with_entropy: the forward also computes per-token entropies
    (an entropy bonus, or π_old taken from the update's own forward); a critic ignores it."""

    mini_batch_size: int
    epochs: int = 1
    shuffle_seed: int | None = None
    with_entropy: bool = False


@dataclass(frozen=True)
class ScoreRequest:
    """What one no-grad scoring forward returns beside the log-probs (`Actor.score_responses`):
    `entropy`, and Σ_v π(v)² for the optimal-token-baseline estimators (`sum_pi_squared`)."""

    with_entropy: bool = False
    with_sum_pi_squared: bool = False


LOG_PROBS_ONLY = ScoreRequest()  # the default: log-probs alone
