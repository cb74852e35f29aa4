"""Layer 5, training engine: the options of one engine call, as one frozen value each.

An update's options (`UpdateRequest`), a scoring forward's (`ScoreRequest`) and a checkpoint
save's (`CheckpointRequest`) are declared here once; every layer above passes the same object
down — the trainer's phases (or the run's checkpoint, `cluster/run_checkpoint.py`) build it, the
handles, worker groups and workers hand it on (`cluster/handles.py` re-exports them for the
trainer), and a Ray rank receives it pickled, unchanged. A worker group that splits an update over
D ranks sends each rank the request with its local mini-batch size (`dataclasses.replace`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class UpdateRequest:
    """One training step of an actor or a critic (`TrainingEngine.update`).

    mini_batch_size: rows per optimizer step (the global size at a worker group, this rank's below it).
    epochs: passes over the batch. shuffle_seed: None keeps the row order; an int shuffles every
    epoch with one seeded generator. with_entropy: the forward also computes per-token entropies
    (an entropy bonus, or π_old taken from the update's own forward); a critic ignores it.
    score_at_ids: a batch column [N, T, k] of token ids at which the forward also scores log π
    (`ResponseScores.top_k_log_probs`: the teacher's top-k, distillation's forward_kl_topk); None: none."""

    mini_batch_size: int
    epochs: int = 1
    shuffle_seed: int | None = None
    with_entropy: bool = False
    score_at_ids: str | None = None


@dataclass(frozen=True)
class ScoreRequest:
    """What one no-grad scoring forward returns beside the log-probs (`Actor.score_responses`):
    `entropy`, Σ_v π(v)² for the optimal-token-baseline estimators (`sum_pi_squared`), and the
    model's `top_k` most likely tokens with their log-probs (a distillation teacher; 0: none)."""

    with_entropy: bool = False
    with_sum_pi_squared: bool = False
    top_k: int = 0


LOG_PROBS_ONLY = ScoreRequest()  # the default: log-probs alone


@dataclass(frozen=True)
class CheckpointRequest:
    """One checkpoint of the policy, global_step_{step} (`PolicyWorker.save_checkpoint`): what is
    saved beside the actor and the RNG states. tokenizer: written with the HF export.
    trainer_state: the trainer's part of the checkpoint. staged_roles: roles their own workers
    staged for this step (a critic's), moved in with it. Retention is the caller's
    (`cluster.run_checkpoint.RunCheckpoint` prunes by lineage)."""

    step: int
    tokenizer: Any = None
    trainer_state: dict[str, Any] | None = None
    staged_roles: tuple[str, ...] = ()
