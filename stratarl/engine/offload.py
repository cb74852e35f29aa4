"""Layer 5, training engine: the colocated memory hand-off — the optimizer state out of device memory.

A colocated worker runs generation and training on one device, one phase at a time (verl's colocated
mode). While it generates, the optimizer's moments are idle (AdamW: two fp32 tensors per parameter,
8 bytes a parameter, twice the bf16 rollout weights): `TrainingEngine.offload_optimizer` moves them
to CPU memory after an update and `reload_optimizer` brings them back before the next one. The
`step` counters never move, for every kernel of `optim.ADAMW_IMPLS`: loop and foreach keep them on
CPU, fused beside the parameter (its kernel reads them there), one 4-byte scalar per parameter
tensor. On a CPU device both are no-ops: nothing moves, 0 bytes.
"""

from __future__ import annotations

import torch
from torch import Tensor


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device | str) -> int:
    """Move every per-parameter state tensor (all but `step`) that is not on `device` there, in place;
    returns the bytes moved. Sharded (DTensor) state moves with its local shard."""
    target = torch.device(device)
    moved = 0
    for state in optimizer.state.values():
        for key, value in state.items():
            if key == "step" or not isinstance(value, Tensor) or _same_device(value.device, target):
                continue
            state[key] = value.to(target)
            moved += value.numel() * value.element_size()
    return moved


def optimizer_state_devices(optimizer: torch.optim.Optimizer) -> set[torch.device]:
    """The devices the per-parameter state tensors (all but `step`) live on ({} before a first step)."""
    return {
        value.device
        for state in optimizer.state.values()
        for key, value in state.items()
        if key != "step" and isinstance(value, Tensor)
    }


def _same_device(a: torch.device, b: torch.device) -> bool:
    """cuda and cuda:<current> are one device; an index left out means the current one."""
    if a.type != b.type:
        return False
    if a.type != "cuda" or a.index == b.index:
        return True
    current = torch.cuda.current_device()
    return (a.index if a.index is not None else current) == (b.index if b.index is not None else current)
