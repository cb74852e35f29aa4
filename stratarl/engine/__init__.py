"""Layer 5, training engine: forward and backward on a model.

Receives a `loss_fn` and a batch, knows nothing of the RL algorithm: micro-batching by token
budget, packing, log-prob and entropy, FSDP2 data parallelism, LoRA, checkpoints."""
