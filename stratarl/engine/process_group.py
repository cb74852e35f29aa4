"""Layer 5, training engine: joining and leaving the torch.distributed group that `DataParallel` spans.

The cluster layer decides who the ranks are and where they meet (rank 0 picks the address and a
free port, the others are told); this module does the joining, because only the engine touches
`torch.distributed`. A collective whose peer died fails after `timeout_s` instead of hanging.
"""

from __future__ import annotations

import socket
from datetime import timedelta

import torch
import torch.distributed as dist

BACKENDS = ("gloo", "nccl")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (the OS picks it); rank 0 announces it to the other ranks."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def join_process_group(
    *,
    address: str,
    port: int,
    rank: int,
    world_size: int,
    backend: str = "gloo",
    timeout_s: float = 600.0,
    cuda_index: int | None = None,
) -> None:
    """Join the default process group of `world_size` ranks meeting at tcp://address:port.

    nccl needs this rank's GPU (`cuda_index`, the one Ray assigned): it becomes the current device and
    the group's bound device, so every collective and every `cuda` tensor of this rank uses it. The
    group then also has gloo for CPU tensors ("cpu:gloo,cuda:nccl"): under FSDP2 CPU offload the
    gradients are CPU shards, and clipping reduces their norm over the ranks (torchtitan does the same)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown process-group backend {backend!r}; valid: {list(BACKENDS)}")
    if backend == "nccl" and cuda_index is None:
        raise ValueError("the nccl backend needs this rank's GPU (cuda_index); was it assigned one?")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside a world of {world_size}")
    if dist.is_initialized():
        raise RuntimeError("this process is already in a process group; leave it first")
    device = None
    if cuda_index is not None:
        torch.cuda.set_device(cuda_index)
        device = torch.device("cuda", cuda_index)
    dist.init_process_group(
        "cpu:gloo,cuda:nccl" if backend == "nccl" else backend,
        init_method=f"tcp://{address}:{port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
        device_id=device if backend == "nccl" else None,
    )


def leave_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
