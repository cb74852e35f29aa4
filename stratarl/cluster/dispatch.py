"""Layer 3, orchestration: a worker group's data path — split a batch over data-parallel ranks, gather back.

Scoring (log-probs): pad the batch to a multiple of D with copies of its leading rows, reorder it so
that each rank's share has about the same work (`engine.partition.rank_balanced_order`, a FLOP proxy
per row), cut D equal shares; afterwards concatenate the ranks' outputs, undo the order and drop the
pad rows. Updates: each global mini-batch is balanced over the ranks on its own, so that rank r's
k-th local mini-batch is its share of the k-th global one and D ranks take the optimizer steps one
rank would (without shuffling); a mini-batch that does not divide is padded with zero-weight rows
(copies whose response_mask is 0: no tokens, no sequences, no gradient).

A worker group holds one `RowPath`, chosen when it is built: `DirectDispatch` here (the shares travel
in the calls) or `queue_rows.QueueRows` (the same shares as references into the TransferQueue). Its
generation, scoring, updates, `materialize`, `clear`, `collecting` and traffic are the group's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from stratarl.cluster.ranks import ControllerTraffic, Method, Ranks
from stratarl.engine.partition import rank_balanced_order
from stratarl.engine.requests import UpdateRequest
from stratarl.rollout.interface import SamplingParams
from stratarl.transport.data_proto import DataProto

if TYPE_CHECKING:  # rollout_set imports queue_rows, which imports this module
    from stratarl.cluster.rollout_set import RolloutReplicas


@dataclass(frozen=True)
class RankSplit:
    """`shards[r]` goes to rank r. Shard rows, concatenated, are rows `order` of the batch padded with
    `pad` copies of its leading rows."""

    shards: list[DataProto]
    order: list[int]
    pad: int


def sequence_lengths(batch: DataProto) -> list[int] | None:
    """Tokens per row (prompt + response), the balancing weight; None when the batch has no tokens yet."""
    if "attention_mask" not in batch:
        return None
    return batch["attention_mask"].sum(-1).tolist()


def balanced_order(batch: DataProto, dp_size: int, *, linear_coeff: float = 0.0) -> list[int]:
    """The row order after which `chunk(dp_size)` gives balanced shares (identity without tokens)."""
    lengths = sequence_lengths(batch)
    if lengths is None or dp_size == 1:
        return list(range(len(batch)))
    return rank_balanced_order(lengths, dp_size, linear_coeff=linear_coeff)


def split_for_ranks(
    batch: DataProto, dp_size: int, *, balance: bool = True, linear_coeff: float = 0.0
) -> RankSplit:
    """D equal shares of `batch` (padded to a multiple of D first), balanced by work when `balance`."""
    padded, pad = batch.pad_to_divisor(dp_size)  # N + pad rows, pad < D
    order = (
        balanced_order(padded, dp_size, linear_coeff=linear_coeff) if balance else list(range(len(padded)))
    )
    return RankSplit(padded.reorder(order).chunk(dp_size), order, pad)


def gather_from_ranks(outputs: list[DataProto], split: RankSplit) -> DataProto:
    """The ranks' outputs as one batch in the original row order, pad rows dropped."""
    if len(outputs) != len(split.shards):
        raise ValueError(f"{len(outputs)} outputs for {len(split.shards)} shards")
    for rank, (out, shard) in enumerate(zip(outputs, split.shards, strict=True)):
        if len(out) != len(shard):
            raise ValueError(f"rank {rank} returned {len(out)} rows for a shard of {len(shard)}")
    merged = DataProto.concat(outputs)  # row j is padded row order[j]
    inverse = np.argsort(np.asarray(split.order, dtype=np.int64), kind="stable")
    return merged.reorder(inverse).unpad(split.pad)


# --- updates -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class UpdateSplit:
    """`shards[r]` is rank r's batch for one update, to be taken in mini-batches of
    `local_mini_batch_size`; `pad_rows` zero-weight rows were added in all."""

    shards: list[DataProto]
    local_mini_batch_size: int
    pad_rows: int


def pad_with_zero_weight_rows(batch: DataProto, divisor: int) -> tuple[DataProto, int]:
    """`batch` padded to a multiple of `divisor` with copies of its leading rows whose response_mask is
    0, so that they add no token, no sequence and no gradient to a globally normalised loss."""
    padded, pad = batch.pad_to_divisor(divisor)
    if pad == 0:
        return padded, 0
    weight = torch.ones(len(padded), 1, dtype=padded["response_mask"].dtype)
    weight[len(batch) :] = 0
    columns = [c for c in padded.columns if c != "response_mask"]
    zeroed = DataProto.from_dict({"response_mask": padded["response_mask"] * weight})
    return padded.select(columns).union(zeroed), pad


def split_for_update(
    batch: DataProto, dp_size: int, mini_batch_size: int, *, linear_coeff: float = 0.0
) -> UpdateSplit:
    """Each global mini-batch (consecutive rows) padded, balanced and cut into D shares; rank r's batch
    is its shares of all mini-batches in order."""
    if mini_batch_size < 1 or len(batch) % mini_batch_size:
        raise ValueError(f"{len(batch)} rows do not split into mini-batches of {mini_batch_size}")
    per_rank: list[list[DataProto]] = [[] for _ in range(dp_size)]
    pad_rows = 0
    for mini in batch.split(mini_batch_size):
        padded, pad = pad_with_zero_weight_rows(mini, dp_size)
        pad_rows += pad
        shares = padded.reorder(balanced_order(padded, dp_size, linear_coeff=linear_coeff)).chunk(dp_size)
        for rank, share in enumerate(shares):
            per_rank[rank].append(share)
    local = -(-mini_batch_size // dp_size)  # ⌈mini / D⌉ rows per rank per mini-batch
    return UpdateSplit([DataProto.concat(parts) for parts in per_rank], local, pad_rows)


def per_rank_request(request: UpdateRequest, split: UpdateSplit) -> UpdateRequest:
    """What each rank receives of a global update request: the same, with its local mini-batch size."""
    return dataclasses.replace(request, mini_batch_size=split.local_mini_batch_size)


# --- the data path of a worker group, chosen once ------------------------------------------------------
class RowPath(Protocol):
    """How a group's rows reach its ranks and engines and come back: `DirectDispatch` (the rows travel
    in the calls) or `queue_rows.QueueRows` (the rows stay in the TransferQueue; the calls carry
    references). A group holds one and delegates to it, never asking which it holds."""

    def generate(
        self, engines: RolloutReplicas, prompts: DataProto, sampling: SamplingParams, *, seed: int | None
    ) -> DataProto: ...

    def score(
        self, ranks: Ranks, phase: str, method: Method, batch: DataProto, columns: Sequence[str], *args: Any
    ) -> DataProto: ...

    def update(
        self, ranks: Ranks, phase: str, method: Method, batch: DataProto, loss_fn: Any, request: UpdateRequest
    ) -> tuple[list[dict[str, float]], UpdateSplit]: ...

    def materialize(self, batch: DataProto) -> DataProto: ...

    def clear(self, through: int | None = None) -> int: ...

    def collecting(self, step: int) -> AbstractContextManager[None]: ...

    def take_traffic(self) -> dict[str, float]: ...

    def held_metrics(self) -> dict[str, float]: ...


@dataclass(frozen=True)
class DirectDispatch:
    """Each rank receives its rows in the call (the in-process backend, or Ray without the queue), so
    the controller holds every column and keeps nothing between phases.

    linear_coeff: the a of the a·s + s² work estimate that balances rows over ranks."""

    linear_coeff: float = 0.0

    def generate(
        self, engines: RolloutReplicas, prompts: DataProto, sampling: SamplingParams, *, seed: int | None
    ) -> DataProto:
        """The engines' results come back whole, in the batch-edge layout."""
        return engines.generate(prompts, sampling, seed=seed)

    def score(
        self, ranks: Ranks, phase: str, method: Method, batch: DataProto, columns: Sequence[str], *args: Any
    ) -> DataProto:
        """`method(worker, share, *args)` (a scoring method of the ranks' worker) on D balanced shares
        of the batch's `columns`; the outputs come back in row order, pad rows dropped."""
        scoring = batch.select([c for c in columns if c in batch], meta_keys=[])
        split = split_for_ranks(scoring, ranks.size, linear_coeff=self.linear_coeff)
        outputs = ranks.call(phase, method, [((shard, *args), {}) for shard in split.shards])
        return gather_from_ranks(outputs, split)

    def update(
        self, ranks: Ranks, phase: str, method: Method, batch: DataProto, loss_fn: Any, request: UpdateRequest
    ) -> tuple[list[dict[str, float]], UpdateSplit]:
        """`method` (an update of the ranks' worker) on each rank's shares of the global mini-batches;
        engines and losses read tensor columns only (texts, sources and ids stay with the controller).
        Returns each rank's metrics and the split (for its pad-row count)."""
        tensors = batch.select(batch.tensor_keys)
        split = split_for_update(tensors, ranks.size, request.mini_batch_size, linear_coeff=self.linear_coeff)
        local = per_rank_request(request, split)
        return ranks.call(phase, method, [((shard, loss_fn, local), {}) for shard in split.shards]), split

    def materialize(self, batch: DataProto) -> DataProto:
        """Every column is here already."""
        return batch

    def clear(self, through: int | None = None) -> int:
        """Nothing is held between steps: no row to drop."""
        return 0

    def collecting(self, step: int) -> AbstractContextManager[None]:
        """Rows carry no collection label."""
        return nullcontext()

    def take_traffic(self) -> dict[str, float]:
        """No bytes of its own: the rows travel in the ranks' calls, counted there."""
        return ControllerTraffic().take()

    def held_metrics(self) -> dict[str, float]:
        return {}
