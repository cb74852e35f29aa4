"""Layer 5, rollout: generation with per-token log-probs.

Engines (native continuous batching on the torch model, vLLM), replicas and routing, weight sync
from the training engine with a version number checked after each sync. Now: the engine interface
(`interface`), the torch backend (`torch_engine`), and the batch-edge layout (`batch_layout`)."""

from stratarl.rollout.batch_layout import results_to_batch
from stratarl.rollout.interface import (
    FinishReason,
    GenerationRequest,
    GenerationResult,
    RolloutEngine,
    SamplingParams,
)
from stratarl.rollout.torch_engine import TorchRolloutEngine
from stratarl.rollout.weight_sync import WeightLoadReport, WeightSyncError, parameter_checksum

__all__ = [
    "FinishReason",
    "GenerationRequest",
    "GenerationResult",
    "RolloutEngine",
    "SamplingParams",
    "TorchRolloutEngine",
    "WeightLoadReport",
    "WeightSyncError",
    "parameter_checksum",
    "results_to_batch",
]
