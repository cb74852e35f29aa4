"""Layer 4, data transport: where do tensors live and how are they referenced?

`DataProto` (the columnar batch), field contracts for every standard column, and the
`TransferQueue` with `KVBatchMeta` references that keep tensors off the controller. Imports only
torch, numpy and tensordict."""
