"""Layer 4, data transport: operations that reshape a batch along its row dim.

`BatchOps` is mixed into `DataProto`: chunk/split for data-parallel ranks and mini-batches,
concat to gather them back, repeat for the n samples of a prompt (repeat_rows: each row its own
number of times), reorder for balancing, pad_to_divisor/unpad for dispatch over ranks that need
equal shares, and a seeded mini-batch iterator. Every method returns new batches; none edits its input.

Chunks follow `numpy.array_split`: k chunks whose sizes differ by at most one, the remainder going
to the first chunks (the same rule as `KVBatchMeta.chunk`, so data and references split alike).
verl requires N % k == 0 unless auto-padding is on, and then gives chunks of ceil(N/k) rows, which
can yield fewer than k chunks; we always return exactly k.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import numpy as np
import torch
from tensordict import TensorDict
from torch import Tensor

B = TypeVar("B", bound="BatchOps")


class BatchOps:
    """Row operations. The class mixing this in provides `__len__`, `take(rows)`, slicing by `[lo:hi]`,
    the attributes below, and a constructor `(batch, non_tensor_batch, meta_info)`."""

    batch: TensorDict
    non_tensor_batch: dict[str, np.ndarray]
    meta_info: dict[str, Any]

    def chunk(self: B, k: int) -> list[B]:
        """k consecutive chunks, sizes ceil(N/k) for the first N mod k chunks and floor(N/k) after."""
        if k < 1:
            raise ValueError(f"chunk needs k >= 1, got {k}")
        bounds = np.cumsum([0] + [len(part) for part in np.array_split(np.arange(len(self)), k)])
        return [self[int(lo) : int(hi)] for lo, hi in itertools.pairwise(bounds)]

    def split(self: B, size: int) -> list[B]:
        """Consecutive batches of `size` rows; the last one holds the remainder."""
        if size < 1:
            raise ValueError(f"split needs size >= 1, got {size}")
        return [self[lo : min(lo + size, len(self))] for lo in range(0, len(self), size)]

    @classmethod
    def concat(cls: type[B], batches: Sequence[B]) -> B:
        """Rows of all batches in order. meta_info is merged: keys other than `metrics` must agree;
        every batch's `metrics` (a dict, or a list of dicts) is gathered into one dict of lists."""
        if not batches:
            raise ValueError("concat needs at least one batch")
        first = batches[0]
        for other in batches[1:]:
            _check_same_columns(first, other)
        tensors = {k: torch.cat([b.batch[k] for b in batches]) for k in list(first.batch.keys())}
        n_rows = sum(len(b) for b in batches)
        others = {k: np.concatenate([b.non_tensor_batch[k] for b in batches]) for k in first.non_tensor_batch}
        return cls(
            TensorDict(tensors, batch_size=[n_rows]), others, _merge_meta([b.meta_info for b in batches])
        )

    def repeat(self: B, n: int, interleave: bool = True) -> B:
        """Each row n times: interleave gives [a, a, b, b] (the n samples of a prompt stay adjacent),
        otherwise the whole batch is tiled: [a, b, a, b]."""
        if n < 1:
            raise ValueError(f"repeat needs n >= 1, got {n}")
        rows = np.arange(len(self))
        return self.take(np.repeat(rows, n) if interleave else np.tile(rows, n))

    def repeat_rows(self: B, times: Sequence[int] | np.ndarray | Tensor) -> B:
        """Row i times[i] times, in row order: times [2, 0, 3] give [a, a, c, c, c] (verl's
        `sample_level_repeat`). `times` holds N counts ≥ 0; meta_info is kept."""
        counts = np.asarray(times.cpu() if isinstance(times, Tensor) else times)
        if counts.shape != (len(self),) or (counts.size and counts.dtype.kind not in "iu"):
            raise ValueError(f"repeat_rows needs {len(self)} integer counts, got {counts.tolist()}")
        if (counts < 0).any():
            raise ValueError(f"repeat_rows needs counts >= 0, got {counts.tolist()}")
        return self.take(np.repeat(np.arange(len(self)), counts.astype(np.int64)))

    def reorder(self: B, permutation: Sequence[int] | np.ndarray | Tensor) -> B:
        """Row i of the result is row permutation[i]; `permutation` must be a permutation of 0..N-1."""
        index = np.asarray(permutation.cpu() if isinstance(permutation, Tensor) else permutation)
        if sorted(index.tolist()) != list(range(len(self))):
            raise ValueError(f"reorder needs a permutation of 0..{len(self) - 1}, got {index.tolist()}")
        return self.take(index)

    def pad_to_divisor(self: B, divisor: int) -> tuple[B, int]:
        """(batch, pad) with pad rows appended so that len % divisor == 0. The pad rows are copies of
        the leading rows, cycling when pad > N (verl's rule); `unpad(pad)` removes them."""
        if divisor < 1:
            raise ValueError(f"pad_to_divisor needs divisor >= 1, got {divisor}")
        pad = -len(self) % divisor
        if pad == 0:  # includes the empty batch
            return self, 0
        return self.take(np.concatenate([np.arange(len(self)), np.arange(pad) % len(self)])), pad

    def unpad(self: B, pad: int) -> B:
        """The batch without its last `pad` rows (the inverse of `pad_to_divisor`)."""
        if not 0 <= pad <= len(self):
            raise ValueError(f"unpad({pad}) on a batch of {len(self)} rows")
        return self[: len(self) - pad]

    def make_iterator(self: B, mini_batch_size: int, epochs: int = 1, seed: int | None = None) -> Iterator[B]:
        """Mini-batches of `mini_batch_size` rows for `epochs` passes, each carrying meta_info.

        seed=None keeps row order; an int shuffles every epoch with a generator seeded once, so the
        same seed gives the same sequence. N must be a multiple of `mini_batch_size` (as in verl).
        """
        if mini_batch_size < 1 or len(self) % mini_batch_size:
            raise ValueError(f"{len(self)} rows do not split into mini-batches of {mini_batch_size}")
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        for _ in range(epochs):
            if generator is None:
                order = torch.arange(len(self))
            else:
                order = torch.randperm(len(self), generator=generator)
            for start in range(0, len(self), mini_batch_size):
                yield self.take(order[start : start + mini_batch_size])


def _check_same_columns(first: BatchOps, other: BatchOps) -> None:
    for kind, a, b in (
        ("tensor", first.batch, other.batch),
        ("non-tensor", first.non_tensor_batch, other.non_tensor_batch),
    ):
        if set(a.keys()) != set(b.keys()):
            diff = sorted(set(a.keys()) ^ set(b.keys()))
            raise ValueError(f"concat: {kind} column(s) {diff} are missing from some batches")
    for name in list(first.batch.keys()):
        x, y = first.batch[name], other.batch[name]
        if x.shape[1:] != y.shape[1:] or x.dtype != y.dtype:
            raise ValueError(
                f"concat: column {name!r} is {list(x.shape[1:])} {x.dtype} per row in one batch "
                f"and {list(y.shape[1:])} {y.dtype} in another"
            )


def _merge_meta(metas: Sequence[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    metrics: list[dict[str, Any]] = []
    for meta in metas:
        for key, value in meta.items():
            if key == "metrics":
                metrics.extend(value if isinstance(value, list) else [value] if value is not None else [])
            elif key in merged and not values_equal(merged[key], value):
                raise ValueError(
                    f"concat: meta_info[{key!r}] differs between batches: {merged[key]!r} vs {value!r}"
                )
            else:
                merged[key] = value
    if metrics:
        names = list(dict.fromkeys(name for m in metrics for name in m))
        merged["metrics"] = {name: [m[name] for m in metrics if name in m] for name in names}
    return merged


def values_equal(a: Any, b: Any) -> bool:
    """Deep equality for column values and meta entries; NaN equals NaN (a copied column stays equal)."""
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        both = isinstance(a, Tensor) and isinstance(b, Tensor)
        return both and a.shape == b.shape and a.dtype == b.dtype and _tensors_equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return False
        if a.dtype != object and b.dtype != object:
            return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
        return all(values_equal(x, y) for x, y in zip(a.ravel(), b.ravel(), strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(values_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(values_equal, a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


def _tensors_equal(a: Tensor, b: Tensor) -> bool:
    """Element-wise equality of same-shape tensors where NaN equals NaN (and nothing else)."""
    if not a.is_floating_point():
        return torch.equal(a, b)
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    return torch.equal(nan_a, nan_b) and torch.equal(a[~nan_a], b[~nan_b])
