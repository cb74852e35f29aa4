"""Layer 5, rollout: generation with per-token log-probs.

Engines (`TorchRolloutEngine`: continuous batching with prefix sharing on the torch model;
`VllmRolloutEngine`: vLLM's engine, imported only when built), replicas behind a least-loaded router
with sticky sessions, and weight sync from the training engine in bounded buckets with a version
and checksum check after each sync. `results_to_batch` lays results out as the trainer's batch edge.
"""

from stratarl.rollout.batch_layout import results_to_batch
from stratarl.rollout.interface import (
    FinishReason,
    GenerationRequest,
    GenerationResult,
    RolloutEngine,
    SamplingParams,
)
from stratarl.rollout.router import RolloutRouter
from stratarl.rollout.torch_engine import TorchRolloutEngine
from stratarl.rollout.weight_sync import (
    WeightLoadReport,
    WeightSyncError,
    bucket_state_dict,
    parameter_checksum,
    push_weights,
)

__all__ = [
    "FinishReason",
    "GenerationRequest",
    "GenerationResult",
    "RolloutEngine",
    "RolloutRouter",
    "SamplingParams",
    "TorchRolloutEngine",
    "WeightLoadReport",
    "WeightSyncError",
    "bucket_state_dict",
    "parameter_checksum",
    "push_weights",
    "results_to_batch",
]
