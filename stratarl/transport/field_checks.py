"""Layer 4, data transport: checking a batch against the field contracts at a phase boundary.

`validate(batch, reads=..., writes=..., phase=...)` checks, for every named field: presence,
dtype kind, a shape consistent with the other fields (the letters N, P, T are bound by the first
field that uses them, and `P+T` must equal their sum), masks holding only 0/1, and nothing
non-finite under a field's mask. It accepts a `DataProto` or a `KVBatchMeta`; a meta carries no
values, so only presence, dtype and shape are checked there (the controller can check references
it never downloads). A DataProto whose bulk columns stay in the TransferQueue lists them in
`meta_info[QUEUED_FIELDS]` (name -> `FieldInfo`); those are checked like a meta's fields.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from stratarl.transport.data_proto import DataProto
from stratarl.transport.fields import DTYPE_KINDS, FIELDS, FieldSpec, field_spec
from stratarl.transport.kv_meta import QUEUED_FIELDS, KVBatchMeta
from stratarl.transport.tensor_codec import torch_dtype


class FieldContractError(ValueError):
    """A batch broke a field contract; the message names the field, what was expected and the phase."""


@dataclass(frozen=True)
class _Column:
    dtype: str  # torch dtype name, or "object" for a non-tensor column
    shape: tuple[int | None, ...]  # None where a meta's rows differ
    values: Tensor | None  # None for a KVBatchMeta


def validate(
    batch: DataProto | KVBatchMeta,
    reads: Iterable[str] = (),
    writes: Iterable[str] = (),
    phase: str = "?",
) -> None:
    """Raise FieldContractError unless `reads` (inputs of `phase`) and `writes` (its outputs, checked
    after it ran) are present and obey their contracts. The mask of a named field is checked too
    when the batch has it."""
    columns = _describe(batch)
    roles = {name: "reads" for name in reads} | {name: "writes" for name in writes}
    for name in list(roles):
        if name not in FIELDS:
            raise FieldContractError(
                f"phase {phase!r} {roles[name]} {name!r}, which no field contract declares"
            )
        mask = field_spec(name).mask
        if mask is not None and mask in columns:
            roles.setdefault(mask, "reads")
    bindings: dict[str, tuple[int, str]] = {}
    for name, role in roles.items():
        where = f"phase {phase!r} {role} {name!r}"
        if name not in columns:
            when = "" if role == "reads" else " after the phase ran"
            raise FieldContractError(
                f"{where}, but the batch has no such column{when}; it has {sorted(columns)}"
            )
        spec, column = FIELDS[name], columns[name]
        _check_dtype(spec, column, where)
        _bind_shape(spec, column, bindings, where)
        if column.values is not None:
            _check_values(spec, column.values, columns, where)
    _check_sequence_length(bindings, phase)


def _describe(batch: DataProto | KVBatchMeta) -> dict[str, _Column]:
    if isinstance(batch, KVBatchMeta):
        n_rows = len(batch)
        return {k: _Column(f.dtype, (n_rows, *f.row_shape), None) for k, f in batch.fields.items()}
    queued = batch.meta_info.get(QUEUED_FIELDS, {})  # held in the TransferQueue, not here
    remote = {k: _Column(f.dtype, (len(batch), *f.row_shape), None) for k, f in queued.items()}
    tensors = {k: _Column(str(v.dtype)[6:], tuple(v.shape), v) for k, v in batch.batch.items()}
    others = {k: _Column("object", tuple(v.shape), None) for k, v in batch.non_tensor_batch.items()}
    return remote | tensors | others


def _check_dtype(spec: FieldSpec, column: _Column, where: str) -> None:
    description, accepted = DTYPE_KINDS[spec.dtype]
    if accepted is None:
        ok = column.dtype == "object"
    else:
        ok = column.dtype != "object" and torch_dtype(column.dtype) in accepted
    if not ok:
        kind = "a non-tensor column" if column.dtype == "object" else f"dtype {column.dtype}"
        raise FieldContractError(f"{where}: expected {description}, got {kind}")


def _bind_shape(spec: FieldSpec, column: _Column, bindings: dict[str, tuple[int, str]], where: str) -> None:
    """Bind the letters of `spec.shape` to `column.shape`, or compare with earlier bindings."""
    if len(column.shape) != len(spec.shape):
        raise FieldContractError(f"{where}: expected shape {spec.shape_text}, got {list(column.shape)}")
    for letter, size in zip(spec.shape, column.shape, strict=True):
        expected = _expected_size(letter, bindings)
        if size is None:
            continue
        if expected is None:
            bindings[letter] = (size, spec.name)
        elif expected[0] != size:
            sizes = [_expected_size(x, bindings) for x in spec.shape]
            filled = [str(s[0]) if s else x for s, x in zip(sizes, spec.shape, strict=True)]
            raise FieldContractError(
                f"{where}: expected shape {spec.shape_text} = [{', '.join(filled)}], "
                f"got {list(column.shape)} ({letter}={expected[0]} was set by {expected[1]!r})"
            )


def _expected_size(letter: str, bindings: dict[str, tuple[int, str]]) -> tuple[int, str] | None:
    if letter in bindings:
        return bindings[letter]
    if letter == "P+T" and "P" in bindings and "T" in bindings:
        (p, p_from), (t, t_from) = bindings["P"], bindings["T"]
        return p + t, f"{p_from}+{t_from}"
    return None


def _check_sequence_length(bindings: dict[str, tuple[int, str]], phase: str) -> None:
    """P+T bound before P and T: the full sequence must still be prompt plus response."""
    if {"P", "T", "P+T"} <= bindings.keys():
        (p, p_from), (t, t_from), (pt, pt_from) = bindings["P"], bindings["T"], bindings["P+T"]
        if p + t != pt:
            raise FieldContractError(
                f"phase {phase!r}: {pt_from!r} has P+T={pt} columns but {p_from!r} gives P={p} "
                f"and {t_from!r} gives T={t}"
            )


def _check_values(spec: FieldSpec, values: Tensor, columns: dict[str, _Column], where: str) -> None:
    if spec.dtype == "mask":
        bad = (values != 0) & (values != 1)
        if bad.any():
            raise FieldContractError(f"{where}: a mask must hold only 0/1, found {values[bad][0].item()!r}")
    if not values.is_floating_point() or spec.mask is None or spec.mask not in columns:
        return
    mask = columns[spec.mask].values
    if mask is None or mask.shape != values.shape:
        return
    non_finite = ~torch.isfinite(values) & mask.bool()
    if non_finite.any():
        row, col = (int(i) for i in non_finite.nonzero()[0])
        raise FieldContractError(
            f"{where}: {int(non_finite.sum())} non-finite value(s) under {spec.mask!r}, "
            f"first at [{row}, {col}] = {values[row, col].item()}"
        )
