"""Layer 5, rollout: generation with per-token log-probs.

Engines (native continuous batching on the torch model, vLLM), replicas and routing, weight sync
from the training engine with a version number checked after each sync."""
