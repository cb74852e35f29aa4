"""Layer 5, training engine: grouping a batch's rows into micro-batches and restoring row order.

By rows (`micro_batch_size` consecutive rows) or by a token budget (`max_tokens`: the fewest groups
whose real-token sums fit, balanced by workload; verl's `use_dynamic_bsz`). Data-parallel ranks run
collectives in every forward and backward, so all ranks run the same number of micro-batches: the
count is the maximum over ranks, and a rank with fewer groups splits its heaviest ones (or, with
single rows left, runs zero-weight passes on an empty group).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from stratarl.engine.data_parallel import DataParallel
from stratarl.engine.packing import LAYOUTS, ModelInputs
from stratarl.engine.partition import micro_batches_by_tokens, split_to_count, workload
from stratarl.transport.data_proto import DataProto

MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")


@dataclass(frozen=True)
class MicroBatching:
    """micro_batch_size: rows per micro-batch when no token budget is set.
    max_tokens: token budget per micro-batch (real tokens, padding excluded; per rank).
    layout: "packed" (no padding computed) or "padded" (the batch-edge layout as is).
    linear_coeff: a in the workload a·s + s² (12·hidden_size for a decoder)."""

    micro_batch_size: int
    max_tokens: int | None = None
    layout: str = "packed"
    linear_coeff: float = 0.0

    def __post_init__(self):
        if self.micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {self.micro_batch_size}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown layout {self.layout!r}; valid: {sorted(LAYOUTS)}")


def sequence_lengths(batch: DataProto) -> list[int]:
    """[N] real tokens (prompt + response, padding excluded) per row."""
    return batch["attention_mask"].sum(dim=1).tolist()


def plan_micro_batches(batch: DataProto, batching: MicroBatching, dp: DataParallel) -> list[list[int]]:
    """Row-index groups, the same number on every rank; empty groups are zero-weight passes."""
    seq_lens = sequence_lengths(batch)
    if batching.max_tokens is None:
        size = batching.micro_batch_size
        groups = [list(range(lo, min(lo + size, len(seq_lens)))) for lo in range(0, len(seq_lens), size)]
    else:
        groups = micro_batches_by_tokens(seq_lens, batching.max_tokens, linear_coeff=batching.linear_coeff)
    count = int(dp.reduce([len(groups)], "max")[0])
    loads = [workload(s, batching.linear_coeff) for s in seq_lens]
    return split_to_count(groups, loads, count)


def model_device(module: torch.nn.Module) -> torch.device:
    """Where a model's parameters live (its batches go there: `ModelSpec.device`)."""
    return next(module.parameters()).device


def model_inputs(
    batch: DataProto, rows: list[int], layout: str, device: torch.device | None = None
) -> ModelInputs:
    """The packed or padded model inputs of `rows` of `batch`, on `device` (None: where the batch is)."""
    index = torch.as_tensor(rows, dtype=torch.long)
    inputs = LAYOUTS[layout](
        batch["input_ids"][index],
        batch["attention_mask"][index],
        batch["position_ids"][index],
        batch["responses"].shape[1],
    )
    return inputs if device is None or device == inputs.input_ids.device else inputs_on(inputs, device)


def inputs_on(inputs: ModelInputs, device: torch.device) -> ModelInputs:
    """`inputs` with every tensor (the attention keywords' too) on `device`."""

    def move(value):
        return value.to(device) if isinstance(value, Tensor) else value

    tensors = {f.name: move(getattr(inputs, f.name)) for f in dataclasses.fields(inputs)}
    tensors["attention_kwargs"] = {k: move(v) for k, v in inputs.attention_kwargs.items()}
    return dataclasses.replace(inputs, **tensors)


def run_in_micro_batches(
    batch: DataProto,
    batching: MicroBatching,
    dp: DataParallel,
    score: Callable[[ModelInputs], dict[str, Tensor]],
    device: torch.device | None = None,
) -> dict[str, Tensor]:
    """score(inputs) -> {name: [m, T, ...]} for every micro-batch, reassembled into {name: [N, T, ...]} in the
    original row order, where the batch is. Runs under no_grad; empty groups run on row 0 and are
    discarded. device: the model's (inputs go there, scores come back)."""
    outputs: dict[str, Tensor] = {}
    home = batch["input_ids"].device
    with torch.no_grad():
        for rows in plan_micro_batches(batch, batching, dp):
            scores = score(model_inputs(batch, rows or [0], batching.layout, device))
            if not rows:
                continue
            for name, grid in scores.items():
                grid = grid.to(home)
                if name not in outputs:
                    outputs[name] = grid.new_zeros((len(batch), *grid.shape[1:]))
                outputs[name][torch.as_tensor(rows)] = grid
    return outputs
