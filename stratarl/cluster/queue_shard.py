"""Layer 3, orchestration: a rank's side of the TransferQueue — read my rows, compute, write my outputs.

With the Ray backend the controller does not send a rank its rows: it sends a `QueueShard`, a
reference of a few hundred bytes (the queue's storage-unit handles, the row keys, which fields to
read). The rank fetches the rows from the storage units itself, runs the same method the
in-process worker runs on a DataProto, and writes what it produced back under the same keys, so
the next phase's ranks find it there. Generation works the same way: an engine lays out its
results and writes every column to the queue; only the columns the controller reads come back.

    controller: QueueShard(keys, fields, rows, zero_weight) ──► rank
    rank:       queue.get(keys, fields) ─ take(rows) ─ zero pad rows' response_mask ─ method(batch)
                └─► queue.put(outputs of the distinct real rows) ; return outputs (or metrics)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from stratarl.rollout.batch_layout import results_to_batch
from stratarl.rollout.interface import GenerationRequest
from stratarl.transport.data_proto import DataProto
from stratarl.transport.kv_meta import QUEUED_FIELDS, KVBatchMeta
from stratarl.transport.transfer_queue import TransferQueue

# The [N, P] and [N, P+T] columns only workers read: they stay in the queue, the controller never
# holds them. Everything else a rollout produces comes back to the controller (reward, advantage
# and metrics read it), as in verl's TransferQueue trainer.
BULK_FIELDS = ("prompts", "input_ids", "position_ids")
WIRE_DTYPES = "wire_dtypes"  # meta_info key: columns sent narrower than they are stored
INT32 = torch.iinfo(torch.int32)


@dataclass(frozen=True)
class QueueShard:
    """What one rank reads: rows `meta.keys[rows[j]]` (j in order; a key may repeat: pad rows copy
    leading rows) with `meta.fields`. Positions in `pad` are padding: their outputs are not stored.
    With `zero_weight` (an update's padding) their response_mask is zeroed as well, so they add no
    token, no sequence and no gradient."""

    queue: TransferQueue
    meta: KVBatchMeta  # distinct keys
    rows: tuple[int, ...]
    pad: tuple[int, ...] = ()
    zero_weight: bool = False

    def read(self) -> DataProto:
        batch = self.queue.get(self.meta).take(list(self.rows))
        if not (self.zero_weight and self.pad):
            return batch
        weight = torch.ones(len(batch), 1, dtype=batch["response_mask"].dtype)
        weight[list(self.pad)] = 0
        zeroed = DataProto.from_dict({"response_mask": batch["response_mask"] * weight})
        return batch.select([c for c in batch.columns if c != "response_mask"]).union(zeroed)

    def write(self, outputs: DataProto) -> None:
        """Store `outputs` (one row per entry of `rows`) for the real rows (each key once)."""
        pad = set(self.pad)
        real = {row: position for position, row in enumerate(self.rows) if position not in pad}
        if real:
            rows = sorted(real)
            self.queue.put(outputs.take([real[r] for r in rows]), meta=self.meta.select_rows(rows))


def run_on_queue(
    worker: Any, shard: QueueShard, method: Callable[..., Any], *args: Any, **kwargs: Any
) -> Any:
    """`method(worker, batch, *args, **kwargs)` on the shard's rows, read from the queue by the rank
    itself; a DataProto result is also written back (log-probs, values), other results (update
    metrics) are only returned. A worker group calls this on every rank like any worker method."""
    result = method(worker, shard.read(), *args, **kwargs)
    if isinstance(result, DataProto):
        shard.write(result)
    return result


def generate_into_queue(
    engine: Any,
    requests: Sequence[GenerationRequest],
    queue: TransferQueue,
    meta: KVBatchMeta,
    *,
    pad_token_id: int,
    prompt_len: int,
    response_len: int,
) -> DataProto:
    """Generate `requests` (row j -> key meta.keys[j]), store every column of the batch-edge layout in
    the queue, and return the columns the controller reads (all but `BULK_FIELDS`, which its
    meta_info[QUEUED_FIELDS] describes), integers narrowed for the wire (`narrow_integers`).

    prompt_len and response_len are the widths of the whole batch (not of this engine's share), so
    that rows written by different engines have the same shape, exactly as one engine would lay
    them out."""
    results = engine.generate(list(requests))
    columns = results_to_batch(
        results, pad_token_id=pad_token_id, max_prompt_len=prompt_len, max_response_len=response_len
    )
    tensors = {k: v for k, v in columns.items() if isinstance(v, torch.Tensor)}
    provenance = {
        "finish_reason": [str(reason) for reason in columns["finish_reason"]],
        "replica_id": [int(replica) for replica in columns["replica_id"]],
    }
    batch = DataProto.from_columns(tensors | provenance)
    stored = queue.put(batch.select(list(tensors), meta_keys=[]), meta=meta)
    controller = narrow_integers(batch.select([c for c in batch.columns if c not in BULK_FIELDS]))
    controller.meta_info[QUEUED_FIELDS] = {name: stored.fields[name] for name in BULK_FIELDS}
    return controller


def narrow_integers(batch: DataProto) -> DataProto:
    """The batch with each int64 column in the narrowest exact dtype for the wire (0/1 masks as bool,
    token ids as int32); meta_info[WIRE_DTYPES] names the dtype `widen_integers` restores. The
    dtype follows this batch's values, so two senders may narrow one column differently: widen each
    part before concatenating parts from several senders."""
    narrowed, wire = {}, {}
    for name in batch.tensor_keys:
        values = batch[name]
        if values.dtype != torch.int64 or values.numel() == 0:
            continue
        low, high = int(values.min()), int(values.max())
        if low >= 0 and high <= 1:
            narrowed[name] = values.to(torch.bool)
        elif INT32.min <= low and high <= INT32.max:
            narrowed[name] = values.to(torch.int32)
        else:
            continue
        wire[name] = "int64"
    others = [c for c in batch.columns if c not in narrowed]
    out = batch.select(others).union(DataProto.from_dict(narrowed)) if narrowed else batch
    out.meta_info[WIRE_DTYPES] = wire
    return out


def widen_integers(batch: DataProto) -> DataProto:
    """Undo `narrow_integers`: the same values in the dtypes the engine laid them out in."""
    wire = batch.meta_info.pop(WIRE_DTYPES, {})
    if not wire:
        return batch
    widened = DataProto.from_dict(
        {name: batch[name].to(getattr(torch, dtype)) for name, dtype in wire.items()}
    )
    return batch.select([c for c in batch.columns if c not in wire]).union(widened)
