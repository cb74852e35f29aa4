"""Layer 4, data transport: `KVBatchMeta`, a reference to a batch held in the TransferQueue.

What the controller passes between phases instead of tensors: the partition (e.g.
`train/step-12`), one key per row, the fields stored for those rows with a dtype and per-row shape
summary, and a small `extra_info` dict (batch-level parameters such as temperature). Its size is
O(rows + fields), never O(rows × tokens). Only the standard library is imported here, so storage
processes that hold the data need neither torch nor tensordict.

Follows TransferQueue 0.1.10's KVBatchMeta: chunks are contiguous with the remainder going to the
first chunks; concat needs one partition and the same fields, skips empty metas and unions
`extra_info`, refusing conflicting values.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# meta_info key of a DataProto whose bulk columns stay in the TransferQueue: {name: FieldInfo}
QUEUED_FIELDS = "queued_fields"


@dataclass(frozen=True)
class FieldInfo:
    """Dtype and per-row shape of one stored field; a dim is None where rows differ."""

    dtype: str  # torch dtype name ("float32", "int64", ...) or "object" for a non-tensor column
    row_shape: tuple[int | None, ...]

    def merge(self, other: FieldInfo, name: str) -> FieldInfo:
        """The summary covering the rows of both; dims that differ become None."""
        if self.dtype != other.dtype or len(self.row_shape) != len(other.row_shape):
            raise ValueError(
                f"field {name!r} is {self.dtype} {list(self.row_shape)} in one part and "
                f"{other.dtype} {list(other.row_shape)} in another"
            )
        merged = tuple(a if a == b else None for a, b in zip(self.row_shape, other.row_shape, strict=True))
        return FieldInfo(self.dtype, merged)


@dataclass(frozen=True)
class KVBatchMeta:
    """Rows `keys` of `partition`, with `fields` stored for every one of them."""

    partition: str
    keys: tuple[str, ...]
    fields: Mapping[str, FieldInfo] = field(default_factory=dict)
    extra_info: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.partition, str) or not self.partition:
            raise ValueError(f"a partition id must be a non-empty string, got {self.partition!r}")
        object.__setattr__(self, "keys", tuple(self.keys))
        object.__setattr__(self, "fields", dict(self.fields))
        object.__setattr__(self, "extra_info", copy.deepcopy(dict(self.extra_info)))
        if len(set(self.keys)) != len(self.keys):
            repeated = sorted({k for k in self.keys if self.keys.count(k) > 1})[:5]
            raise ValueError(f"row keys must be unique; repeated: {repeated}")

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def field_names(self) -> list[str]:
        return list(self.fields)

    def select_fields(self, names: Sequence[str]) -> KVBatchMeta:
        """The same rows, referring only to `names`."""
        missing = [n for n in names if n not in self.fields]
        if missing:
            raise KeyError(f"field(s) {missing} not in this meta; it has {self.field_names}")
        return KVBatchMeta(self.partition, self.keys, {n: self.fields[n] for n in names}, self.extra_info)

    def select_rows(self, rows: Sequence[int] | slice) -> KVBatchMeta:
        """The rows at positions `rows` (or a slice), in that order."""
        keys = self.keys[rows] if isinstance(rows, slice) else tuple(self.keys[int(i)] for i in rows)
        return KVBatchMeta(self.partition, keys, self.fields, self.extra_info)

    def select_keys(self, keys: Sequence[str]) -> KVBatchMeta:
        """The rows with `keys`, in that order; KeyError for a key this meta does not hold."""
        position = {k: i for i, k in enumerate(self.keys)}
        unknown = [k for k in keys if k not in position]
        if unknown:
            raise KeyError(f"row key(s) {unknown[:5]} not in this meta of partition {self.partition!r}")
        return self.select_rows([position[k] for k in keys])

    def chunk(self, k: int) -> list[KVBatchMeta]:
        """k contiguous parts (one per data-parallel rank); sizes differ by at most one, larger first."""
        if k < 1:
            raise ValueError(f"chunk needs k >= 1, got {k}")
        base, extra = divmod(len(self), k)
        bounds = list(itertools.accumulate([base + (i < extra) for i in range(k)], initial=0))
        return [self.select_rows(slice(lo, hi)) for lo, hi in itertools.pairwise(bounds)]

    @classmethod
    def concat(cls, metas: Sequence[KVBatchMeta]) -> KVBatchMeta:
        """Rows of all metas in order. One partition and the same fields are required; empty metas
        are skipped; extra_info is unioned and conflicting values raise."""
        if not metas:
            raise ValueError("concat needs at least one KVBatchMeta")
        parts = [m for m in metas if len(m)] or [metas[0]]
        first = parts[0]
        fields = dict(first.fields)
        for part in parts[1:]:
            if part.partition != first.partition:
                raise ValueError(f"concat across partitions {first.partition!r} and {part.partition!r}")
            if set(part.fields) != set(fields):
                raise ValueError(f"concat of metas with fields {sorted(fields)} and {sorted(part.fields)}")
            fields = {n: info.merge(part.fields[n], n) for n, info in fields.items()}
        keys = tuple(k for part in parts for k in part.keys)
        return cls(first.partition, keys, fields, _union_extra([m.extra_info for m in metas]))

    def union(self, other: KVBatchMeta) -> KVBatchMeta:
        """The same rows with the fields and extra_info of both (rows must match, in order)."""
        if (self.partition, self.keys) != (other.partition, other.keys):
            raise ValueError(
                f"union of metas over different rows ({self.partition!r}, {len(self)} rows vs "
                f"{other.partition!r}, {len(other)} rows, or another order)"
            )
        fields = dict(self.fields)
        for name, info in other.fields.items():
            if name in fields and fields[name] != info:
                raise ValueError(
                    f"union: field {name!r} is {fields[name]} in one meta and {info} in the other"
                )
            fields[name] = info
        return KVBatchMeta(
            self.partition, self.keys, fields, _union_extra([self.extra_info, other.extra_info])
        )

    def with_fields(self, fields: Mapping[str, FieldInfo], extra_info: Mapping[str, Any] = ()) -> KVBatchMeta:
        """The same rows with `fields` added or replaced and `extra_info` entries set (later wins)."""
        return KVBatchMeta(
            self.partition, self.keys, {**self.fields, **fields}, {**self.extra_info, **dict(extra_info)}
        )


def _union_extra(dicts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for extra in dicts:
        for key, value in extra.items():
            if key in merged and merged[key] != value:
                raise ValueError(f"extra_info[{key!r}] conflicts: {merged[key]!r} vs {value!r}")
            merged[key] = value
    return merged
