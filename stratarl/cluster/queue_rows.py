"""Layer 3, orchestration: the controller's side of the TransferQueue — row keys, what is stored, shards.

Every row of a step gets a key (`queue_key`, a non-tensor column, so it follows the row through
take, concat and repeat). Workers write their outputs under those keys; the controller keeps, per
key and field, a digest (crc32) of the values it knows are stored. Before a worker phase,
`sync(batch, fields)` writes only the columns the controller changed or added since (its
advantages, its scores, a response_mask it edited), never the bulk columns, which it does not
hold; a stale value can therefore not reach a rank silently. Then the phase's rows are cut into
per-rank `QueueShard`s with the same padding and balancing as the in-process dispatch
(`dispatch.split_for_ranks`, `split_for_update`), computed on the row indices alone.

Under trainer.mode=one_step_off/async the rollout writes the next batches' rows while the trainer
works on this step's, so the end of a step cannot drop the whole partition. Each key is labelled
with the step its rows were collected for (`collecting(step)`, around a producer's collection;
keys issued outside one — sync mode, rows the controller lays out while training — are unlabelled),
and `clear(through=k)` drops the unlabelled rows and those of collections for steps ≤ k: the batch
just trained, and rows dropped on the way (filtered groups, stale batches), never a batch ahead.
"""

from __future__ import annotations

import itertools
import threading
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from stratarl.cluster.dispatch import (
    RankSplit,
    UpdateSplit,
    gather_from_ranks,
    per_rank_request,
    split_for_ranks,
    split_for_update,
)
from stratarl.cluster.queue_shard import QueueShard, run_on_queue
from stratarl.cluster.ranks import Method, Ranks
from stratarl.engine.requests import UpdateRequest
from stratarl.rollout.interface import SamplingParams
from stratarl.transport.data_proto import DataProto
from stratarl.transport.kv_meta import QUEUED_FIELDS, FieldInfo, KVBatchMeta
from stratarl.transport.tensor_codec import dtype_name, tensor_to_array
from stratarl.transport.transfer_queue import TransferQueue

if TYPE_CHECKING:  # rollout_set imports this module
    from stratarl.cluster.rollout_set import RolloutReplicas

KEY = "queue_key"
# What a forward of the model reads: every scoring and update phase sends these.
MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")


class QueueRows:
    """Keys and stored-value digests of the rows the controller has in `queue`'s `partition`."""

    def __init__(self, queue: TransferQueue, partition: str = "rollout", *, linear_coeff: float = 0.0):
        self.queue, self.partition = queue, partition
        self.balance = linear_coeff  # the a of the a·s + s² work estimate that balances rows over ranks
        self._digests: dict[str, dict[str, int]] = {}  # key -> field -> crc32 of the stored row
        self._counter = itertools.count()
        self._issued: dict[int | None, list[str]] = {}  # collection step (None: unlabelled) -> keys
        self._lock = threading.Lock()  # the producer thread issues keys while the trainer clears
        self._label = threading.local()  # the step this thread is collecting for (`collecting`)

    @contextmanager
    def collecting(self, step: int) -> Iterator[None]:
        """Keys this thread issues inside the block belong to the collection for `step`."""
        self._label.step = step
        try:
            yield
        finally:
            self._label.step = None

    def new_keys(self, n: int) -> list[str]:
        label = getattr(self._label, "step", None)
        with self._lock:
            keys = [f"r{next(self._counter)}" for _ in range(n)]
            self._issued.setdefault(label, []).extend(keys)
        return keys

    def remember(self, keys: Sequence[str], columns: DataProto) -> None:
        """`columns` (row j = key j) are stored: record their digests (a worker wrote them)."""
        for name in columns.tensor_keys:
            for key, digest in zip(keys, _row_digests(columns[name]), strict=True):
                self._digests.setdefault(key, {})[name] = digest

    def keys_of(self, batch: DataProto) -> list[str]:
        """The batch's row keys; rows laid out by the controller (agent episodes) get new ones."""
        if KEY in batch:
            return [str(k) for k in batch[KEY]]
        return self.new_keys(len(batch))

    def sync(self, batch: DataProto, fields: Sequence[str]) -> KVBatchMeta:
        """A reference to `fields` of the batch's rows, after storing every local column whose
        stored value is missing or differs. A field neither local nor queued raises KeyError."""
        keys = self.keys_of(batch)
        queued: dict[str, FieldInfo] = batch.meta_info.get(QUEUED_FIELDS, {})
        infos: dict[str, FieldInfo] = {}
        for name in fields:
            if name in batch.tensor_keys:
                self._store_changed(keys, name, batch[name])
                values = batch[name]
                infos[name] = FieldInfo(dtype_name(values.dtype), tuple(values.shape[1:]))
            elif name in queued:
                infos[name] = queued[name]
            else:
                raise KeyError(f"field {name!r} is neither in the batch nor in the TransferQueue")
        return KVBatchMeta(self.partition, keys, infos)

    def _store_changed(self, keys: list[str], name: str, values: torch.Tensor) -> None:
        digests = _row_digests(values)
        stale = [i for i, (k, d) in enumerate(zip(keys, digests, strict=True)) if self._stored(k, name) != d]
        if not stale:
            return
        meta = KVBatchMeta(self.partition, [keys[i] for i in stale])
        self.queue.put(DataProto.from_dict({name: values[stale]}), meta=meta)
        for i in stale:
            self._digests.setdefault(keys[i], {})[name] = digests[i]

    def _stored(self, key: str, name: str) -> int | None:
        return self._digests.get(key, {}).get(name)

    # --- shards ----------------------------------------------------------------------------------
    def scoring_shards(
        self, meta: KVBatchMeta, attention_mask: torch.Tensor, dp_size: int, *, linear_coeff: float = 0.0
    ) -> tuple[list[QueueShard], RankSplit]:
        """Per-rank shards of a scoring phase; the split's order and pad undo them (`gather_from_ranks`)."""
        index = DataProto.from_dict({"row": torch.arange(len(meta)), "attention_mask": attention_mask})
        split = split_for_ranks(index, dp_size, linear_coeff=linear_coeff)
        is_pad = np.asarray(split.order) >= len(meta)  # padded row order[j] sits at position j
        shards, start = [], 0
        for part in split.shards:
            pad = np.flatnonzero(is_pad[start : start + len(part)])
            shards.append(self._shard(meta, part["row"].tolist(), pad))
            start += len(part)
        return shards, split

    def update_shards(
        self,
        meta: KVBatchMeta,
        attention_mask: torch.Tensor,
        dp_size: int,
        mini_batch_size: int,
        *,
        linear_coeff: float = 0.0,
    ) -> tuple[list[QueueShard], UpdateSplit]:
        """Per-rank shards of an update: each global mini-batch balanced over the ranks, zero-weight
        pad rows where it does not divide (`dispatch.split_for_update`)."""
        weight = torch.ones(len(meta), 1, dtype=torch.int64)  # stands for response_mask: 0 marks a pad row
        index = DataProto.from_dict(
            {"row": torch.arange(len(meta)), "attention_mask": attention_mask, "response_mask": weight}
        )
        split = split_for_update(index, dp_size, mini_batch_size, linear_coeff=linear_coeff)
        shards = []
        for part in split.shards:
            pad = np.flatnonzero(part["response_mask"][:, 0].numpy() == 0)
            shards.append(self._shard(meta, part["row"].tolist(), pad, zero_weight=True))
        return shards, split

    def _shard(
        self, meta: KVBatchMeta, rows: list[int], pad: Sequence[int], *, zero_weight: bool = False
    ) -> QueueShard:
        distinct = sorted(set(rows))
        position = {row: i for i, row in enumerate(distinct)}
        return QueueShard(
            self.queue,
            meta.select_rows(distinct),
            tuple(position[r] for r in rows),
            tuple(int(i) for i in pad),
            zero_weight,
        )

    # --- a phase through the queue (a `dispatch.RowPath`) -------------------------------------------
    def generate(
        self, engines: RolloutReplicas, prompts: DataProto, sampling: SamplingParams, *, seed: int | None
    ) -> DataProto:
        """The engines write the rows here; the bulk columns stay (`RolloutReplicas.generate_queued`)."""
        return engines.generate_queued(prompts, sampling, self, seed=seed)

    def score(
        self, ranks: Ranks, phase: str, method: Method, batch: DataProto, columns: Sequence[str], *args: Any
    ) -> DataProto:
        """`method(worker, rows, *args)` (a scoring method of the ranks' worker) on the batch's rows,
        via the queue: store what the controller changed, send each rank a shard reference; the ranks
        write their outputs to the queue and return them (advantage and metrics read them here)."""
        meta = self.sync(batch, columns)
        shards, split = self.scoring_shards(
            meta, batch["attention_mask"], ranks.size, linear_coeff=self.balance
        )
        outputs = gather_from_ranks(
            ranks.call(phase, run_on_queue, [((s, method, *args), {}) for s in shards]), split
        )
        self.remember(meta.keys, outputs)
        return outputs

    def update(
        self, ranks: Ranks, phase: str, method: Method, batch: DataProto, loss_fn: Any, request: UpdateRequest
    ) -> tuple[list[dict[str, float]], UpdateSplit]:
        """`method` (an update of the ranks' worker) on the batch's rows read from the queue: the
        model's inputs and the columns the loss declares it reads (`loss_fn.reads`; every tensor
        column for a loss that declares none). Returns each rank's metrics and the split."""
        queued = batch.meta_info.get(QUEUED_FIELDS, {})
        reads = getattr(loss_fn, "reads", None)
        wanted = [*MODEL_INPUTS, *reads] if reads is not None else [*batch.tensor_keys, *queued]
        meta = self.sync(batch, [f for f in dict.fromkeys(wanted) if f in batch.tensor_keys or f in queued])
        shards, split = self.update_shards(
            meta, batch["attention_mask"], ranks.size, request.mini_batch_size, linear_coeff=self.balance
        )
        local = per_rank_request(request, split)
        calls = [((shard, method, loss_fn, local), {}) for shard in shards]
        return ranks.call(phase, run_on_queue, calls), split

    def materialize(self, batch: DataProto) -> DataProto:
        """The batch with its queued bulk columns read back from the queue and without its row keys:
        plain columns, detached from this queue (what a checkpoint saves of a batch collected ahead;
        a resumed run's new queue gives it fresh keys). A batch without queued columns is returned
        as it is."""
        queued = batch.meta_info.get(QUEUED_FIELDS, {})
        if not queued:
            return batch
        meta = KVBatchMeta(self.partition, self.keys_of(batch), {})
        bulk = self.queue.get(meta, fields=list(queued)).select(list(queued), meta_keys=[])
        columns = [c for c in batch.columns if c != KEY]
        local = batch.select(columns, meta_keys=[k for k in batch.meta_info if k != QUEUED_FIELDS])
        return local.union(bulk)

    def take_traffic(self) -> dict[str, float]:
        """Bytes the controller wrote to and read from the queue since the last call (Ray units
        count them; storage in this process moves none between processes)."""
        traffic = getattr(self.queue.units, "traffic", None)
        if traffic is None:
            return {"controller/sent_bytes": 0.0, "controller/received_bytes": 0.0}
        return traffic.take()

    @property
    def rows_held(self) -> int:
        """Keys issued and not cleared yet (rows in the queue, or about to be written)."""
        with self._lock:
            return sum(len(keys) for keys in self._issued.values())

    def held_metrics(self) -> dict[str, float]:
        """`controller/queue_rows_held`: after a step's clear, the rows of the batches collected ahead."""
        return {"controller/queue_rows_held": float(self.rows_held)}

    def clear(self, through: int | None = None) -> int:
        """The end of a step: drop the unlabelled rows and those collected for steps ≤ `through`
        (None: every row of the partition); returns how many rows were dropped."""
        with self._lock:
            if through is None:
                self._issued.clear()
                self._digests.clear()
                return self.queue.clear(self.partition)
            done = [label for label in self._issued if label is None or label <= through]
            keys = [key for label in done for key in self._issued.pop(label)]
        for key in keys:
            self._digests.pop(key, None)
        return self.queue.clear(KVBatchMeta(self.partition, keys)) if keys else 0


def _row_digests(values: torch.Tensor) -> list[int]:
    """crc32 of each row's bytes (dtype and shape are part of the stored field, checked elsewhere)."""
    array, _ = tensor_to_array(values.contiguous())  # bfloat16 as same-width integers
    return [zlib.crc32(row.tobytes()) for row in array.reshape(len(array), -1)]
