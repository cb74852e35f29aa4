"""Layer 5, training engine: forward and backward on a model (docs/engine.md).

Receives a `loss_fn` and a batch, knows nothing of the RL algorithm: actor, reference and critic;
micro-batching by token budget, packing, chunked log-prob and entropy, FSDP2 data parallelism,
LoRA, checkpoints, MFU."""
