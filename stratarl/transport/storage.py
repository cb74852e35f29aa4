"""Layer 4, data transport: storage units, the shards that hold a TransferQueue's rows.

A `StorageUnit` is a plain class (numpy and the standard library only, so that a Ray actor can
wrap it without importing torch): per partition, rows × fields of numpy values, plus each row's
production record (which fields exist) and consumption record (which consumers have read it).
Data crosses its methods as `Column = (array, dtype_name)`: dim 0 of the array is rows, and the
name is the torch dtype to restore (see `tensor_codec`) or "object" for a non-tensor column.

`StorageUnits` is the small interface through which the `TransferQueue` client reaches a set of
units: `submit` starts a call on one unit, `collect` waits for a list of calls. `InProcessUnits`
runs the calls directly; `stratarl.cluster.transfer_queue_ray.RayStorageUnits` runs them on actors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from stratarl.transport.kv_meta import FieldInfo

Column = tuple[np.ndarray, str]


@dataclass
class _Row:
    seq: int  # put order: rows are listed oldest first
    # field -> (block, i): row i of the array stored by one put; rows of a put share its block, so
    # a get of rows from one put is a single fancy index instead of a per-row stack
    values: dict[str, tuple[np.ndarray, int]] = field(default_factory=dict)
    consumed_by: set[str] = field(default_factory=set)


class StorageUnit:
    """One shard: rows of several partitions, with production and consumption status per row.

    A block stays in memory while any of its rows holds it (clearing some rows of a put frees
    nothing until all of them, or the partition, are cleared).
    """

    def __init__(self) -> None:
        self._rows: dict[str, dict[str, _Row]] = {}  # partition -> key -> row
        self._dtypes: dict[str, dict[str, str]] = {}  # partition -> field -> dtype name

    def put(
        self, partition: str, keys: Sequence[str], seqs: Sequence[int], columns: Mapping[str, Column]
    ) -> None:
        """Store `columns` for rows `keys` (new rows get sequence numbers `seqs`; existing rows gain or
        overwrite fields). Values are copied, so the unit owns its memory and later edits by the
        caller (or a read-only Ray buffer) cannot reach it."""
        rows = self._rows.setdefault(partition, {})
        dtypes = self._dtypes.setdefault(partition, {})
        blocks = {}
        for name, (values, dtype) in columns.items():
            if len(values) != len(keys):
                raise ValueError(f"field {name!r} has {len(values)} rows for {len(keys)} keys")
            if dtypes.setdefault(name, dtype) != dtype:
                raise ValueError(f"field {name!r} of partition {partition!r} is {dtypes[name]}, not {dtype}")
            blocks[name] = np.array(values, copy=True)
        for i, key in enumerate(keys):
            row = rows.setdefault(key, _Row(int(seqs[i])))
            for name, block in blocks.items():
                row.values[name] = (block, i)

    def get(
        self, partition: str, keys: Sequence[str], fields: Sequence[str], consumer: str | None = None
    ) -> dict[str, Column]:
        """`fields` of rows `keys`, in that order; records `consumer` as having read them."""
        rows = self._lookup(partition, keys)
        out = {}
        for name in fields:
            missing = [k for k, row in zip(keys, rows, strict=True) if name not in row.values]
            if missing:
                raise KeyError(f"field {name!r} not produced yet for row(s) {missing[:5]} of {partition!r}")
            out[name] = (_gather([row.values[name] for row in rows], name), self._dtypes[partition][name])
        if consumer is not None:
            for row in rows:
                row.consumed_by.add(consumer)
        return out

    def describe(self, partition: str, keys: Sequence[str], fields: Sequence[str]) -> dict[str, FieldInfo]:
        """Dtype and per-row shape of `fields` over rows `keys` (dims where rows differ become None)."""
        rows = self._lookup(partition, keys)
        infos: dict[str, FieldInfo] = {}
        for name in fields:
            blocks = {id(block): block for block, _ in (row.values[name] for row in rows)}
            for block in blocks.values():
                info = FieldInfo(self._dtypes[partition][name], tuple(block.shape[1:]))
                infos[name] = infos[name].merge(info, name) if name in infos else info
        return infos

    def ready(
        self, partition: str, fields: Sequence[str], consumer: str | None = None
    ) -> list[tuple[int, str]]:
        """(seq, key) of rows holding every one of `fields` and not yet read by `consumer`."""
        return [
            (row.seq, key)
            for key, row in self._rows.get(partition, {}).items()
            if all(f in row.values for f in fields) and (consumer is None or consumer not in row.consumed_by)
        ]

    def status(self, partition: str) -> list[tuple[int, str, tuple[str, ...], tuple[str, ...]]]:
        """(seq, key, fields produced, consumers that read it) for every row of `partition`."""
        return [
            (row.seq, key, tuple(row.values), tuple(sorted(row.consumed_by)))
            for key, row in self._rows.get(partition, {}).items()
        ]

    def clear(self, partition: str, keys: Sequence[str] | None = None) -> int:
        """Drop the rows `keys` of `partition` (None: the whole partition); returns how many were held."""
        rows = self._rows.get(partition, {})
        if keys is None:
            self._rows.pop(partition, None)
            self._dtypes.pop(partition, None)
            return len(rows)
        return sum(rows.pop(k, None) is not None for k in keys)

    def nbytes(self) -> int:
        """Bytes of the rows held (an object value counts as one pointer)."""
        refs = (ref for rows in self._rows.values() for row in rows.values() for ref in row.values.values())
        return sum(block.nbytes // len(block) for block, _ in refs)

    def _lookup(self, partition: str, keys: Sequence[str]) -> list[_Row]:
        rows = self._rows.get(partition, {})
        missing = [k for k in keys if k not in rows]
        if missing:
            raise KeyError(f"row key(s) {missing[:5]} not in partition {partition!r} of this storage unit")
        return [rows[k] for k in keys]


def _gather(refs: list[tuple[np.ndarray, int]], name: str) -> np.ndarray:
    """One array whose row j is refs[j] = (block, i) -> block[i]: one fancy index per block."""
    if not refs:
        raise ValueError(f"a get of field {name!r} needs at least one row")
    groups: dict[int, tuple[np.ndarray, list[int], list[int]]] = {}  # id(block) -> block, positions, rows
    for position, (block, i) in enumerate(refs):
        group = groups.setdefault(id(block), (block, [], []))
        group[1].append(position)
        group[2].append(i)
    if len(groups) == 1:
        block, _, indices = next(iter(groups.values()))
        return block[indices]
    shapes = {block.shape[1:] for block, _, _ in groups.values()}
    if len(shapes) > 1:
        raise ValueError(
            f"rows of field {name!r} have different shapes {sorted(shapes)[:4]}; get them separately"
        )
    dtype = np.result_type(*(block.dtype for block, _, _ in groups.values()))
    out = np.empty((len(refs), *shapes.pop()), dtype=dtype)
    for block, positions, indices in groups.values():
        out[positions] = block[indices]
    return out


class StorageUnits(Protocol):
    """A fixed set of storage units addressed 0..len-1; calls on different units may run concurrently."""

    def __len__(self) -> int: ...

    def submit(self, unit: int, method: str, *args: Any) -> Any:
        """Start `StorageUnit.<method>(*args)` on unit `unit`; returns a pending call."""
        ...

    def collect(self, pending: Sequence[Any]) -> list[Any]:
        """The results of pending calls, in order (raises the first error)."""
        ...


class InProcessUnits:
    """Storage units living in this process: the embedded default for the local backend and tests."""

    def __init__(self, num_units: int = 2):
        if num_units < 1:
            raise ValueError(f"need at least one storage unit, got {num_units}")
        self.units = [StorageUnit() for _ in range(num_units)]

    def __len__(self) -> int:
        return len(self.units)

    def submit(self, unit: int, method: str, *args: Any) -> Any:
        return getattr(self.units[unit], method)(*args)

    def collect(self, pending: Sequence[Any]) -> list[Any]:
        return list(pending)
