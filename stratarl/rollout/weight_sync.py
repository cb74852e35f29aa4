"""Layer 5, rollout: loading new weights into a served model in place, and proving that it happened.

A silent failure to sync (wrong key names, a copy of the model updated instead of the served one,
a dtype cast dropped, a lost bucket, a replica that kept its old version) leaves the rollout
sampling from stale weights while the trainer believes otherwise (trl #5312 is one such bug). So:
the key sets are checked strictly; weights travel in buckets of bounded size (`bucket_state_dict`,
large tensors cut along their first dimension); the receiver (`WeightReceiver`) checks that every
served tensor was covered and, at the end, that the served tensors hold what arrived; and the sender
(`push_weights`) checks each replica's version and checksum. The checksum (`parameter_checksum`) is
exact and copy-free: one read of each tensor on each side, no float64 copies.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor, nn


class WeightSyncError(RuntimeError):
    """The weights sent do not fit the served model, or did not land in it."""


@dataclass(frozen=True)
class WeightLoadReport:
    """What one load did: the version now served, tensors sent, tensors whose values changed, a
    checksum of the values sent (equal to `parameter_checksum` of the sender's dict), and the bytes
    that travelled (0 where a backend does not count them). shared: the engine serves the trainer's
    own module (`TorchRolloutEngine.serve_shared_weights`): nothing was sent or compared, so
    num_changed, checksum and num_bytes are 0 and num_tensors counts the tensors served."""

    version: int
    num_tensors: int
    num_changed: int
    checksum: int
    num_bytes: int = 0
    shared: bool = False


def tensor_bytes(tensors: Mapping[str, Tensor]) -> int:
    """Σ numel · element size: the bytes a dict of tensors takes on the wire."""
    return sum(t.numel() * t.element_size() for t in tensors.values())


_SAME_WIDTH_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32}


def tensor_checksum(tensor: Tensor) -> int:
    """Σ_i bits(x_i): the sum of the elements' bit patterns read as integers of their width (8-byte
    elements as two 4-byte halves), accumulated in int64. A view, no copy: one read of the tensor.

    Exact, so sender and receiver compare with `==`: any changed element changes it (its bits change
    the sum by a non-zero integer), and the sums of a tensor's row slices add up to the tensor's."""
    x = tensor.detach().reshape(1) if tensor.dim() == 0 else tensor.detach()
    if x.element_size() == 8:
        x = x.contiguous().view(torch.int32)  # a no-op for the contiguous tensors a state dict holds
    return int(x.view(_SAME_WIDTH_INT[x.element_size()]).sum(dtype=torch.int64))


def parameter_checksum(tensors: Mapping[str, Tensor]) -> int:
    """Σ_k `tensor_checksum`(x_k): the exact fingerprint of a dict of tensors that sender and
    receiver compare (dtype-sensitive: a cast tensor has other bits)."""
    return sum(tensor_checksum(tensor) for tensor in tensors.values())


def value_checksum(tensors: Mapping[str, Tensor]) -> float:
    """Σ_k Σ_i (x_ki + |x_ki|) in float64: a fingerprint of the values, tolerant of the summation
    order, for comparing tensors that a backend stores in its own layout (`vllm_engine`)."""
    total = torch.zeros((), dtype=torch.float64)
    for tensor in tensors.values():
        x = tensor.detach().double()
        total += (x.sum() + x.abs().sum()).cpu()
    return float(total)


def _tied_aliases(model: nn.Module) -> dict[str, set[str]]:
    """For each parameter name, the other names of the same tensor (tied embeddings, shared layers)."""
    names_by_tensor: dict[int, set[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names_by_tensor.setdefault(id(param), set()).add(name)
    return {name: names - {name} for names in names_by_tensor.values() for name in names}


def check_state_dict_keys(model: nn.Module, state_dict: Mapping[str, Tensor]) -> None:
    """Raise `WeightSyncError` naming missing keys, unexpected keys and shape mismatches.

    A key may be omitted when a tied alias of it is sent (e.g. `lm_head.weight` with tied
    embeddings, which safetensors checkpoints store once).
    """
    served = model.state_dict()
    aliases = _tied_aliases(model)
    sent = state_dict.keys()
    missing = sorted(k for k in served if k not in sent and not (aliases.get(k, set()) & sent))
    unexpected = sorted(k for k in state_dict if k not in served)
    wrong_shape = sorted(
        f"{k}: sent {tuple(state_dict[k].shape)}, served {tuple(served[k].shape)}"
        for k in state_dict
        if k in served and state_dict[k].shape != served[k].shape
    )
    found = {"missing keys": missing, "unexpected keys": unexpected, "shapes": wrong_shape}
    problems = [
        f"{label} ({len(items)}): {', '.join(items[:10])}{' …' if len(items) > 10 else ''}"
        for label, items in found.items()
        if items
    ]
    if problems:
        raise WeightSyncError("state_dict does not fit the served model: " + "; ".join(problems))


@torch.no_grad()
def load_in_place(model: nn.Module, state_dict: Mapping[str, Tensor], version: int) -> WeightLoadReport:
    """Copy `state_dict` into the served model's tensors (cast to their dtype/device) and verify.

    Raises `WeightSyncError` if the keys do not fit, or if any served tensor differs from what was
    sent after the copy.
    """
    check_state_dict_keys(model, state_dict)
    served = model.state_dict()
    num_changed = sum(not torch.equal(served[k], _as_served(v, served[k])) for k, v in state_dict.items())
    model.load_state_dict(dict(state_dict), strict=False)
    served = model.state_dict()
    not_landed = sorted(
        k for k, v in state_dict.items() if not torch.equal(served[k], _as_served(v, served[k]))
    )
    if not_landed:
        raise WeightSyncError(
            f"weights for version {version} did not land in the served model: {', '.join(not_landed[:10])}"
        )
    checksum = parameter_checksum({k: served[k] for k in state_dict})
    return WeightLoadReport(
        version=version,
        num_tensors=len(state_dict),
        num_changed=num_changed,
        checksum=checksum,
        num_bytes=tensor_bytes(state_dict),
    )


def _as_served(sent: Tensor, served: Tensor) -> Tensor:
    return sent.detach().to(device=served.device, dtype=served.dtype)


# --- bucketed sync ---------------------------------------------------------------------------------
DEFAULT_BUCKET_BYTES = 64 * 2**20


@dataclass(frozen=True)
class TensorSlice:
    """Rows [start, start + len(tensor)) of the tensor `name`, which has `total_rows` rows in all
    (a 0-d tensor travels whole, as 1 row)."""

    name: str
    start: int
    tensor: Tensor
    total_rows: int

    @property
    def nbytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size()


def bucket_state_dict(state_dict: Mapping[str, Tensor], bucket_bytes: int) -> Iterator[list[TensorSlice]]:
    """Consecutive buckets of at most `bucket_bytes` each. A tensor larger than a bucket is cut into
    row slices along dim 0; only a single row larger than a bucket makes a bucket exceed the bound."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    bucket: list[TensorSlice] = []
    size = 0
    for name, tensor in state_dict.items():
        for piece in _row_slices(name, tensor.detach(), bucket_bytes):
            if bucket and size + piece.nbytes > bucket_bytes:
                yield bucket
                bucket, size = [], 0
            bucket.append(piece)
            size += piece.nbytes
    if bucket:
        yield bucket


def _row_slices(name: str, tensor: Tensor, bucket_bytes: int) -> Iterator[TensorSlice]:
    if tensor.dim() == 0 or tensor.numel() * tensor.element_size() <= bucket_bytes:
        yield TensorSlice(name, 0, tensor, _rows(tensor))
        return
    row_bytes = tensor[0].numel() * tensor.element_size()
    rows = max(1, bucket_bytes // row_bytes)
    for start in range(0, tensor.shape[0], rows):
        yield TensorSlice(name, start, tensor[start : start + rows], tensor.shape[0])


def _rows(t: Tensor) -> int:
    return 1 if t.dim() == 0 else t.shape[0]


class WeightReceiver:
    """The receiving end of one sync into `model`: slices are copied in place as they arrive.

    partial=True accepts an update of some tensors only (e.g. the merged target modules of a LoRA
    adapter); otherwise `finish` requires every served tensor (or a tied alias of it) in full.
    """

    def __init__(self, model: nn.Module, version: int, *, partial: bool = False) -> None:
        self.model, self.version, self.partial = model, version, partial
        self.served = model.state_dict()  # shares storage with the parameters and buffers
        self.aliases = _tied_aliases(model)
        self.rows_received: dict[str, int] = {}
        self.received_checksum: dict[str, int] = {}  # per tensor, of the values as served (cast)
        self.sent_checksum = 0  # of the values as sent, comparable with the sender's
        self.changed: set[str] = set()
        self.num_bytes = 0

    @torch.no_grad()
    def receive(self, bucket: Sequence[TensorSlice]) -> None:
        for piece in bucket:
            target = self.served.get(piece.name)
            if target is None:
                raise WeightSyncError(f"unexpected tensor {piece.name!r} for version {self.version}")
            region = target if target.dim() == 0 else target[piece.start : piece.start + _rows(piece.tensor)]
            if region.shape != piece.tensor.shape:
                raise WeightSyncError(
                    f"{piece.name} rows {piece.start}+: sent {tuple(piece.tensor.shape)}, "
                    f"served {tuple(region.shape)}"
                )
            value = _as_served(piece.tensor, region)  # the sent tensor itself when no cast is needed
            if not torch.equal(region, value):
                self.changed.add(piece.name)
            region.copy_(value)  # whether it held is checked once, in `finish`, on the model afresh
            self.rows_received[piece.name] = self.rows_received.get(piece.name, 0) + _rows(piece.tensor)
            sent = tensor_checksum(piece.tensor)
            landed = sent if value is piece.tensor else tensor_checksum(value)
            self.received_checksum[piece.name] = self.received_checksum.get(piece.name, 0) + landed
            self.sent_checksum += sent
            self.num_bytes += piece.nbytes

    def finish(self) -> WeightLoadReport:
        """Check coverage and that the served model (fetched afresh) holds what arrived; report."""
        full = {k for k, n in self.rows_received.items() if n == _rows(self.served[k])}
        wrong_rows = sorted(k for k in self.rows_received if k not in full)  # some rows lost, or twice
        absent = sorted(
            k
            for k in self.served
            if k not in self.rows_received and not self.partial and not (self.aliases.get(k, set()) & full)
        )
        if wrong_rows or absent:
            raise WeightSyncError(
                f"sync to version {self.version} incomplete: tensors never received {absent[:10]}, "
                f"received with missing or repeated rows {wrong_rows[:10]}"
            )
        now = self.model.state_dict()
        not_held = sorted(k for k, c in self.received_checksum.items() if tensor_checksum(now[k]) != c)
        if not_held:
            raise WeightSyncError(
                f"weights for version {self.version} did not land in the served model: "
                f"{', '.join(not_held[:10])}"
            )
        return WeightLoadReport(
            version=self.version,
            num_tensors=len(self.rows_received),
            # a tied alias changed with its twin, although its own copy found the values already there
            num_changed=len({a for k in self.changed for a in self.aliases.get(k, set()) | {k}} & set(full)),
            checksum=self.sent_checksum,
            num_bytes=self.num_bytes,
        )


class WeightSyncTarget(Protocol):
    """What `push_weights` needs of a replica (the torch engine, the vLLM engine)."""

    replica_id: int

    @property
    def weight_version(self) -> int: ...

    def check_weights(self, state_dict: Mapping[str, Tensor]) -> None: ...

    def begin_weight_update(self, version: int, *, partial: bool = False) -> None: ...

    def receive_weights(self, bucket: Sequence[TensorSlice]) -> None: ...

    def finish_weight_update(self) -> WeightLoadReport: ...


def push_weights(
    state_dict: Mapping[str, Tensor],
    replicas: Sequence[WeightSyncTarget],
    *,
    version: int,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    partial: bool = False,
) -> list[WeightLoadReport]:
    """Send `state_dict` to every replica in buckets, then check that each serves `version` with
    exactly what was sent (checksum of the sent values); any silent failure raises WeightSyncError.
    Unless partial, every replica first checks the key set, so that a misfit loads nothing."""
    if not partial:  # strict keys on every replica before anything is sent: a misfit loads nothing
        for replica in replicas:
            replica.check_weights(state_dict)
    expected = parameter_checksum(state_dict)
    reports = []
    for replica in replicas:
        replica.begin_weight_update(version, partial=partial)
        for bucket in bucket_state_dict(state_dict, bucket_bytes):
            replica.receive_weights(bucket)
        report = replica.finish_weight_update()
        check_sync(replica, report, version=version, expected_checksum=expected)
        reports.append(report)
    return reports


class PushedReplica:
    """The `load_weights` of one served model (the torch and vLLM engines, which implement the
    receiving side of `WeightSyncTarget`): `push_weights` to this replica alone."""

    def load_weights(
        self: WeightSyncTarget,
        state_dict: Mapping[str, Tensor],
        version: int,
        *,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        partial: bool = False,
    ) -> WeightLoadReport:
        """Load the trainer's weights in place, in buckets, verified, and serve them as `version`.

        Keys are checked strictly before anything is loaded (unless partial=True, e.g. the merged
        target modules of a LoRA adapter)."""
        (report,) = push_weights(
            state_dict, [self], version=version, bucket_bytes=bucket_bytes, partial=partial
        )
        return report


def check_sync(
    replica: WeightSyncTarget, report: WeightLoadReport, *, version: int, expected_checksum: int
) -> None:
    """The check after each sync: the replica serves `version`, and received what was sent."""
    if replica.weight_version != version or report.version != version:
        raise WeightSyncError(
            f"replica {replica.replica_id} serves version {replica.weight_version} "
            f"(report: {report.version}) after a sync to version {version}"
        )
    if report.checksum != expected_checksum:
        raise WeightSyncError(
            f"replica {replica.replica_id} received checksum {report.checksum!r} for version {version}, "
            f"sender sent {expected_checksum!r}"
        )
