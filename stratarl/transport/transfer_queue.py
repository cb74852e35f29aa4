"""Layer 4, data transport: the `TransferQueue` client, which keeps tensors off the controller.

Workers `put` their outputs into storage units and `get` their inputs from them; the controller
passes only `KVBatchMeta` references between phases. Rows are sharded over the units by a stable
hash of their key (crc32, identical in every process), so any client finds any row without asking
a directory, and a `get` of rows held by several units assembles them in the meta's row order.

Production and consumption status live with the rows, in the storage units: `ready(partition,
fields, consumer=...)` lists rows whose fields have all been produced and that `consumer` has not
read yet; `get(meta, consumer=...)` records the read. TransferQueue (verl's optional dependency)
keeps this status in a separate controller process instead; here there is none to deploy, and a
status query costs one metadata call per unit.
"""

from __future__ import annotations

import time
import uuid
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from stratarl.transport.data_proto import DataProto
from stratarl.transport.kv_meta import FieldInfo, KVBatchMeta
from stratarl.transport.storage import Column, InProcessUnits, StorageUnits
from stratarl.transport.tensor_codec import array_to_tensor, tensor_to_array, torch_dtype


@dataclass(frozen=True)
class RowStatus:
    """Which fields of a row have been produced, and which consumers have read it."""

    fields: frozenset[str]
    consumed_by: frozenset[str]


def unit_of(key: str, num_units: int) -> int:
    """The storage unit holding row `key` (crc32, not `hash`, which differs between processes)."""
    return zlib.crc32(key.encode()) % num_units


class TransferQueue:
    """Client of a set of storage units; cheap to pickle when its units are (e.g. Ray actor handles)."""

    def __init__(self, units: StorageUnits):
        self.units = units

    @classmethod
    def in_process(cls, num_units: int = 2) -> TransferQueue:
        """A queue whose storage units live in this process (the local backend and tests)."""
        return cls(InProcessUnits(num_units))

    def put(
        self,
        data: DataProto | Mapping[str, Any],
        partition: str | None = None,
        *,
        meta: KVBatchMeta | None = None,
        keys: Sequence[str] | None = None,
    ) -> KVBatchMeta:
        """Store a batch (or a dict of columns) and return the reference to it.

        With `partition`, the rows are new (or upserted under `keys`; default: fresh unique keys).
        With `meta`, the batch holds new fields for the rows `meta` refers to, in its order (a
        worker writing its outputs); the returned meta refers to the old and new fields.
        meta_info of the batch is merged into the meta's `extra_info`.
        """
        batch = data if isinstance(data, DataProto) else DataProto.from_columns(data)
        if (partition is None) == (meta is None):
            raise ValueError("put needs exactly one of `partition` (new rows) or `meta` (rows to extend)")
        if meta is not None:
            if keys is not None:
                raise ValueError("put with `meta` writes the meta's rows; do not pass `keys` too")
            partition, keys = meta.partition, meta.keys
        elif keys is None:
            token = uuid.uuid4().hex[:8]
            keys = [f"{token}.{i}" for i in range(len(batch))]
        if len(keys) != len(batch):
            raise ValueError(f"put of {len(batch)} rows with {len(keys)} keys (partition {partition!r})")
        columns = _encode(batch)
        infos = {name: FieldInfo(dtype, tuple(values.shape[1:])) for name, (values, dtype) in columns.items()}
        # built before any data moves, so that bad keys (repeated ones) store nothing
        stored = KVBatchMeta(partition, keys, infos, batch.meta_info) if meta is None else None
        first_seq = time.time_ns()
        pending = [
            self.units.submit(
                unit,
                "put",
                partition,
                [keys[i] for i in rows],
                (first_seq + rows).tolist(),
                {name: (values[rows], dtype) for name, (values, dtype) in columns.items()},
            )
            for unit, rows in self._route(keys).items()
        ]
        self.units.collect(pending)
        return stored if stored is not None else meta.with_fields(infos, batch.meta_info)

    def get(
        self, meta: KVBatchMeta, fields: Sequence[str] | None = None, *, consumer: str | None = None
    ) -> DataProto:
        """The rows of `meta` (in its order) with `fields` (None: the meta's fields), as a DataProto
        whose meta_info is the meta's extra_info. `consumer` records who read them."""
        names = list(meta.fields) if fields is None else list(fields)
        routes = self._route(meta.keys)
        pending = [
            self.units.submit(unit, "get", meta.partition, [meta.keys[i] for i in rows], names, consumer)
            for unit, rows in routes.items()
        ]
        parts = self.units.collect(pending)
        tensors, others = {}, {}
        for name in names:
            if routes:
                values, dtype = _assemble(
                    name, len(meta), list(routes.values()), [part[name] for part in parts]
                )
            else:
                values, dtype = _empty_column(meta, name)
            if dtype == "object":
                others[name] = values
            else:
                tensors[name] = array_to_tensor(values, dtype)
        return DataProto.from_dict(tensors, others, dict(meta.extra_info))

    def clear(self, target: str | KVBatchMeta) -> int:
        """Drop a whole partition, or the rows a meta refers to; returns the number of rows dropped."""
        if isinstance(target, str):
            pending = [self.units.submit(unit, "clear", target, None) for unit in range(len(self.units))]
        else:
            pending = [
                self.units.submit(unit, "clear", target.partition, [target.keys[i] for i in rows])
                for unit, rows in self._route(target.keys).items()
            ]
        return sum(self.units.collect(pending))

    def ready(
        self, partition: str, fields: Sequence[str], *, consumer: str | None = None, limit: int | None = None
    ) -> KVBatchMeta:
        """A meta for the rows of `partition` (oldest first, at most `limit`) whose `fields` have all
        been produced and which `consumer` has not read yet. It does not reserve them: the read
        is recorded when `get(meta, consumer=...)` runs."""
        pending = [
            self.units.submit(unit, "ready", partition, list(fields), consumer)
            for unit in range(len(self.units))
        ]
        rows = sorted(row for unit_rows in self.units.collect(pending) for row in unit_rows)
        keys = [key for _, key in rows[:limit]]
        routes = self._route(keys)
        pending = [
            self.units.submit(unit, "describe", partition, [keys[i] for i in positions], list(fields))
            for unit, positions in routes.items()
        ]
        infos: dict[str, FieldInfo] = {}
        for described in self.units.collect(pending):
            for name, info in described.items():
                infos[name] = infos[name].merge(info, name) if name in infos else info
        return KVBatchMeta(partition, tuple(keys), infos)

    def status(self, partition: str) -> dict[str, RowStatus]:
        """Production and consumption status of every row of `partition`, oldest first."""
        pending = [self.units.submit(unit, "status", partition) for unit in range(len(self.units))]
        rows = sorted(row for unit_rows in self.units.collect(pending) for row in unit_rows)
        return {key: RowStatus(frozenset(fields), frozenset(readers)) for _, key, fields, readers in rows}

    def stored_bytes(self) -> int:
        """Bytes of array data held by all storage units together."""
        return sum(self.units.collect([self.units.submit(u, "nbytes") for u in range(len(self.units))]))

    def _route(self, keys: Sequence[str]) -> dict[int, np.ndarray]:
        """unit -> positions (into `keys`) of the rows it holds, for units holding any."""
        units = np.fromiter((unit_of(k, len(self.units)) for k in keys), dtype=np.int64, count=len(keys))
        return {int(u): np.flatnonzero(units == u) for u in np.unique(units)}


def _encode(batch: DataProto) -> dict[str, Column]:
    """Every column as (numpy array, dtype name): tensors as views of their memory (see tensor_codec)."""
    columns = {name: tensor_to_array(tensor) for name, tensor in batch.batch.items()}
    return columns | {name: (values, "object") for name, values in batch.non_tensor_batch.items()}


def _assemble(name: str, n_rows: int, positions: list[np.ndarray], parts: list[Column]) -> Column:
    """One array of `n_rows` rows from per-unit parts: row positions[u][j] is parts[u][j]."""
    first, dtype = parts[0]
    if len(parts) == 1 and first.flags.writeable:  # one unit holds every row, already in order
        return first, dtype
    # result_type: a non-tensor string column may be '<U5' in one unit and '<U9' in another
    out = np.empty((n_rows, *first.shape[1:]), dtype=np.result_type(*(values for values, _ in parts)))
    for rows, (values, _) in zip(positions, parts, strict=True):
        if values.shape[1:] != first.shape[1:]:
            raise ValueError(
                f"field {name!r} has rows of shape {list(first.shape[1:])} in one storage unit and "
                f"{list(values.shape[1:])} in another; get those rows separately"
            )
        out[rows] = values
    return out, dtype


def _empty_column(meta: KVBatchMeta, name: str) -> Column:
    """A column of zero rows shaped after the meta's summary (a get of an empty meta)."""
    info = meta.fields[name]
    if info.dtype == "object":
        return np.empty(0, dtype=object), "object"
    empty = torch.empty((0, *(d or 0 for d in info.row_shape)), dtype=torch_dtype(info.dtype))
    return tensor_to_array(empty)
