"""Layer 4, data transport: `DataProto`, the columnar batch every phase reads and writes.

N rows, three parts: tensor columns in a `TensorDict` (all sharing dim 0), non-tensor columns as
numpy arrays of length N (uid, data_source, ground truth, ...), and `meta_info`, a small dict
(temperature, global step, metrics; never a config object). Column names are unique across both
kinds, so a column is addressed by name alone: `batch["responses"]`, `batch.select(["uid"])`.
Row operations (chunk, concat, repeat, padding, mini-batches) live in `batch_ops.BatchOps`.

Departures from verl's `DataProto`: `union`, `rename` and `reorder` return a new batch instead of
editing this one (only `pop` mutates, because removing is its purpose); `select`/`pop` take one
list of column names for both kinds; pickling sends tensors as numpy buffers (see `tensor_codec`).
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from torch import Tensor

from stratarl.transport.batch_ops import BatchOps, values_equal
from stratarl.transport.tensor_codec import array_to_tensor, tensor_to_array

RowIndex = int | slice | Sequence[int] | np.ndarray | Tensor


@dataclass
class DataProtoItem:
    """One row: 0-d tensors, the row's non-tensor values, and the batch's meta_info."""

    batch: TensorDict
    non_tensor_batch: dict[str, Any] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)


class DataProto(BatchOps):
    """A batch of N rows: `batch` (TensorDict, batch_size [N]), `non_tensor_batch`, `meta_info`."""

    def __init__(
        self,
        batch: TensorDict | None = None,
        non_tensor_batch: Mapping[str, np.ndarray] | None = None,
        meta_info: Mapping[str, Any] | None = None,
    ):
        non_tensor_batch = dict(non_tensor_batch or {})
        if batch is None:
            n_rows = len(next(iter(non_tensor_batch.values()))) if non_tensor_batch else 0
            batch = TensorDict({}, batch_size=[n_rows])
        self.batch = batch
        self.non_tensor_batch = non_tensor_batch
        self.meta_info = dict(meta_info or {})
        self.check_consistency()

    @classmethod
    def from_dict(
        cls,
        tensors: Mapping[str, Tensor] | None = None,
        non_tensors: Mapping[str, np.ndarray | Sequence[Any]] | None = None,
        meta_info: Mapping[str, Any] | None = None,
    ) -> DataProto:
        """Build from tensors (shared dim 0) and non-tensor columns (lists become object arrays)."""
        tensors = dict(tensors or {})
        columns = {
            k: v if isinstance(v, np.ndarray) else _object_array(v) for k, v in (non_tensors or {}).items()
        }
        if not tensors:
            n_rows = len(next(iter(columns.values()))) if columns else 0
            return cls(TensorDict({}, batch_size=[n_rows]), columns, meta_info)
        scalars = [name for name, tensor in tensors.items() if tensor.dim() == 0]
        if scalars:
            raise ValueError(
                f"tensor column(s) {scalars} are 0-d; a column needs a row dim (scalars go in meta_info)"
            )
        first_name, first = next(iter(tensors.items()))
        for name, tensor in tensors.items():
            if tensor.shape[0] != first.shape[0]:
                raise ValueError(
                    f"tensor column {name!r} has shape {list(tensor.shape)} but {first_name!r} has "
                    f"{first.shape[0]} rows: all columns of a batch share dim 0"
                )
        return cls(TensorDict(tensors, batch_size=[first.shape[0]]), columns, meta_info)

    @classmethod
    def from_columns(
        cls, columns: Mapping[str, Any], meta_info: Mapping[str, Any] | None = None
    ) -> DataProto:
        """Build from one dict: torch tensors become tensor columns, everything else non-tensor columns."""
        tensors = {k: v for k, v in columns.items() if isinstance(v, Tensor)}
        others = {k: v for k, v in columns.items() if not isinstance(v, Tensor)}
        return cls.from_dict(tensors, others, meta_info)

    def check_consistency(self) -> None:
        """Raise ValueError when a column's length differs from N or a name is used twice."""
        if len(self.batch.batch_size) != 1:
            raise ValueError(f"the tensor batch must have one batch dim, got {tuple(self.batch.batch_size)}")
        n_rows = self.batch.batch_size[0]
        for name, values in self.non_tensor_batch.items():
            if not isinstance(values, np.ndarray):
                raise TypeError(
                    f"non-tensor column {name!r} must be a numpy array, not {type(values).__name__}"
                )
            if values.ndim == 0 or values.shape[0] != n_rows:
                length = values.shape[0] if values.ndim else "a 0-d"
                raise ValueError(f"non-tensor column {name!r} has {length} rows but the batch has {n_rows}")
            if name in self.batch:
                raise ValueError(f"column {name!r} is both a tensor and a non-tensor column")

    # ---- shape and access ------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.batch.batch_size[0])

    @property
    def tensor_keys(self) -> list[str]:
        return list(self.batch.keys())

    @property
    def non_tensor_keys(self) -> list[str]:
        return list(self.non_tensor_batch)

    @property
    def columns(self) -> list[str]:
        return self.tensor_keys + self.non_tensor_keys

    def __contains__(self, name: object) -> bool:
        return name in self.batch or name in self.non_tensor_batch

    def __getitem__(self, item: str | RowIndex) -> Any:
        """A column by name; one row (`DataProtoItem`) by int; a sub-batch by slice, index array or mask."""
        if isinstance(item, str):
            self._require([item])
            return self.batch[item] if item in self.batch else self.non_tensor_batch[item]
        if isinstance(item, int | np.integer):
            row = int(item)
            values = {k: v[row] for k, v in self.non_tensor_batch.items()}
            return DataProtoItem(self.batch[row], values, self.meta_info)
        if isinstance(item, slice):
            sliced = {k: v[item] for k, v in self.non_tensor_batch.items()}
            return type(self)(self.batch[item], sliced, self.meta_info)
        return self.take(item)

    def take(self, rows: Sequence[int] | np.ndarray | Tensor) -> DataProto:
        """The rows at `rows` (integer positions, or a bool mask of length N), in that order."""
        index = np.asarray(rows.cpu() if isinstance(rows, Tensor) else rows)
        if index.dtype == bool:
            if index.shape != (len(self),):
                raise ValueError(f"a bool row mask must have shape ({len(self)},), got {index.shape}")
            index = np.flatnonzero(index)
        index = index.astype(np.int64).reshape(-1)
        gathered = TensorDict(
            {k: v[torch.from_numpy(index)] for k, v in self.batch.items()}, batch_size=[len(index)]
        )
        return type(self)(gathered, {k: v[index] for k, v in self.non_tensor_batch.items()}, self.meta_info)

    # ---- columns ---------------------------------------------------------------------------
    def select(
        self, columns: Sequence[str] | None = None, meta_keys: Sequence[str] | None = None
    ) -> DataProto:
        """Only `columns` (None: all) and the `meta_keys` of meta_info (None: all); tensors are shared."""
        columns = self.columns if columns is None else list(columns)
        self._require(columns)
        batch = self.batch.select(*[c for c in columns if c in self.batch])
        others = {c: self.non_tensor_batch[c] for c in columns if c in self.non_tensor_batch}
        meta = self.meta_info if meta_keys is None else {k: self.meta_info[k] for k in meta_keys}
        return type(self)(batch, others, meta)

    def pop(self, columns: Sequence[str], meta_keys: Sequence[str] = ()) -> DataProto:
        """Remove `columns` (and `meta_keys`) from this batch and return them as a new batch."""
        self._require(columns)
        popped = self.select(columns, meta_keys=[])
        for name in columns:
            if name in self.batch:
                del self.batch[name]
            else:
                del self.non_tensor_batch[name]
        popped.meta_info = {k: self.meta_info.pop(k) for k in meta_keys}
        return popped

    def rename(self, old: str | Sequence[str], new: str | Sequence[str]) -> DataProto:
        """A batch whose columns `old` are called `new` (tensor or non-tensor columns alike)."""
        old, new = ([old], [new]) if isinstance(old, str) else (list(old), list(new))
        if len(old) != len(new):
            raise ValueError(f"rename needs as many new names as old ones, got {old} -> {new}")
        self._require(old)
        mapping = dict(zip(old, new, strict=True))
        kept = [c for c in self.columns if c not in mapping]
        for name in new:
            if name in kept:
                raise ValueError(f"rename target {name!r} already exists in the batch")
        tensors = {mapping.get(k, k): v for k, v in self.batch.items()}
        others = {mapping.get(k, k): v for k, v in self.non_tensor_batch.items()}
        return type(self)(TensorDict(tensors, batch_size=self.batch.batch_size), others, self.meta_info)

    def union(self, other: DataProto) -> DataProto:
        """The columns and meta_info of both; a column or meta key present in both must be equal."""
        if len(self) != len(other):
            raise ValueError(f"union of batches with {len(self)} and {len(other)} rows")
        for name in set(self.columns) & set(other.columns):
            if not values_equal(self[name], other[name]):
                raise ValueError(f"union: column {name!r} is present in both batches with different values")
        for key in set(self.meta_info) & set(other.meta_info):
            if not values_equal(self.meta_info[key], other.meta_info[key]):
                raise ValueError(f"union: meta_info[{key!r}] differs between the two batches")
        tensors = {**dict(other.batch.items()), **dict(self.batch.items())}
        others = {**other.non_tensor_batch, **self.non_tensor_batch}
        batch = TensorDict(tensors, batch_size=self.batch.batch_size)
        return type(self)(batch, others, {**other.meta_info, **self.meta_info})

    def to(self, device: str | torch.device) -> DataProto:
        """The same batch with its tensors on `device`."""
        return type(self)(self.batch.to(device), self.non_tensor_batch, self.meta_info)

    def _require(self, columns: Sequence[str]) -> None:
        missing = [c for c in columns if c not in self]
        if missing:
            raise KeyError(f"column(s) {missing} not in the batch; it has {self.columns}")

    # ---- persistence -----------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """Tensors as numpy buffers: pickle protocol 5 (and Ray) move them out of band, without copies."""
        tensors = {k: tensor_to_array(v) for k, v in self.batch.items()}
        return {
            "n_rows": len(self),
            "tensors": tensors,
            "non_tensors": self.non_tensor_batch,
            "meta": self.meta_info,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        tensors = {k: array_to_tensor(array, name) for k, (array, name) in state["tensors"].items()}
        self.batch = TensorDict(tensors, batch_size=[state["n_rows"]])
        self.non_tensor_batch = state["non_tensors"]
        self.meta_info = state["meta"]

    def save(self, path: str | Path) -> None:
        """Write the batch to `path` (pickle protocol 5)."""
        with open(path, "wb") as f:
            pickle.dump(self, f, protocol=5)

    @classmethod
    def load(cls, path: str | Path) -> DataProto:
        """Read a batch written by `save` (a pickle: load only files you trust)."""
        with open(path, "rb") as f:
            data = pickle.load(f)
        if not isinstance(data, cls):
            raise TypeError(f"{path} holds a {type(data).__name__}, not a {cls.__name__}")
        return data

    def __repr__(self) -> str:
        tensors = ", ".join(f"{k}: {list(v.shape)} {str(v.dtype)[6:]}" for k, v in self.batch.items())
        others = ", ".join(self.non_tensor_batch)
        meta = list(self.meta_info)
        return f"DataProto(N={len(self)}; tensors {{{tensors}}}; non-tensors [{others}]; meta {meta})"


def _object_array(values: Sequence[Any]) -> np.ndarray:
    """A 1-d object array holding `values` as they are (np.array would split nested lists into dims)."""
    array = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        array[i] = value
    return array
