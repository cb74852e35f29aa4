"""Layer 4, data transport: where do tensors live and how are they referenced?

`DataProto` (the columnar batch), field contracts for every standard column, and the
`TransferQueue` with `KVBatchMeta` references that keep tensors off the controller. Imports only
torch, numpy and tensordict.

Import from the modules (`stratarl.transport.data_proto`, `.fields`, `.field_checks`, `.kv_meta`,
`.storage`, `.transfer_queue`); this package re-exports nothing, so that a storage-unit process
importing `storage` (numpy only) does not load torch. See docs/transport.md.
"""
