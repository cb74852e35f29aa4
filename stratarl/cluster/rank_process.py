"""Layer 3, orchestration: the process a rank runs in — a Ray actor that holds one worker of its role.

`RankProcess` is the same for every role: it does not inherit a worker, it holds one (`worker`),
built in this process by `build`, a picklable callable such as `partial(PolicyWorker, spec)`. So a
rank runs literally the construction code of the in-process backend, and every call is
`run(method, ...)` = `method(worker, ...)` with the worker class's own functions. A rank starts in
two steps, because the ranks of a role must meet before any model is sharded over them:

1. the constructor only sets this process's torch threads (its CPU share, or
   `cluster.threads_per_worker`) and, when Ray assigned it GPUs, its CUDA device (`cuda` in this
   process then means that GPU: `cuda_device_index`);
2. `start_ranks` asks every rank for its node, lets rank 0 choose where the group meets
   (`rendezvous_address`: loopback when all ranks share a node), and has every rank `join` there at
   once; joining builds the worker with `distributed=True` (its models sharded over the group).

A process with no group (a rollout replica of the split plan) is built by `start` instead. Each
role forms its own torch.distributed group (gloo on CPU, nccl on GPU): a critic's ranks never meet
the policy's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import ray
import torch
import transformers
from ray.util.placement_group import PlacementGroup

from stratarl.cluster.placement import ResourcePool
from stratarl.cluster.ray_cluster import actor_options
from stratarl.cluster.ray_ranks import RayRanks
from stratarl.engine.process_group import free_port, join_process_group, leave_process_group

WorkerBuild = Callable[..., Any]  # build() or build(distributed=True) -> the role's worker


def cuda_device_index(gpu_ids: Sequence[str | int], visible_devices: str | None) -> int | None:
    """The local CUDA index of the first GPU Ray assigned this process (None: none assigned).

    Ray sets CUDA_VISIBLE_DEVICES to the ids it assigned, so the GPU is that id's position in the
    variable (0 for one GPU a process); where Ray leaves the variable alone
    (RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES) the id is the index."""
    if not gpu_ids:
        return None
    first = str(gpu_ids[0])
    visible = [v.strip() for v in (visible_devices or "").split(",") if v.strip()]
    return visible.index(first) if first in visible else int(first)


class RankProcess:
    """Rank `rank` of `world_size` of a role, holding the worker `build` makes (None until built)."""

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        threads: int,
        build: WorkerBuild,
        backend: str = "gloo",
        timeout_s: float = 600.0,
    ):
        transformers.logging.disable_progress_bar()  # no per-process load bars in the driver log
        torch.set_num_threads(threads)  # this process's CPU share: never more threads than cores
        self.cuda_index = cuda_device_index(ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES"))
        if self.cuda_index is not None:  # before any model, batch or nccl communicator touches a GPU
            torch.cuda.set_device(self.cuda_index)
        self.rank, self.world_size, self.build, self.threads = rank, world_size, build, threads
        self.backend, self.timeout_s = backend, timeout_s
        self.worker: Any = None

    def run(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`method(worker, *args, **kwargs)`: every call a worker group makes to this rank."""
        if torch.get_num_threads() != self.threads:  # a call on another thread of a concurrent actor
            torch.set_num_threads(self.threads)
        return method(self.worker, *args, **kwargs)

    # --- start-up ----------------------------------------------------------------------------------
    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def rendezvous_address(self, loopback: bool) -> tuple[str, int]:
        """Where the group meets: this node's address (loopback when every rank is on this node)
        and a port free here now."""
        host = "127.0.0.1" if loopback else ray.util.get_node_ip_address()
        return host, free_port(host)

    def join(self, address: str, port: int) -> None:
        """Join the role's process group, then build the worker, its models sharded over the group."""
        join_process_group(
            address=address,
            port=port,
            rank=self.rank,
            world_size=self.world_size,
            backend=self.backend,
            timeout_s=self.timeout_s,
            cuda_index=self.cuda_index,
        )
        self.worker = self.build(distributed=True)

    def start(self) -> None:
        """Build the worker in this process alone (no group): a rollout replica."""
        self.worker = self.build()

    def leave(self) -> None:
        leave_process_group()


def start_processes(
    pool: ResourcePool,
    group: PlacementGroup,
    build: Callable[[int], WorkerBuild],
    *,
    threads: int | None,
    max_concurrency: int = 1,
    **kwargs: Any,
) -> list[Any]:
    """One `RankProcess` actor per bundle of `pool` (process r on bundle r, with `build(r)`, threads
    from its share unless `threads`); `kwargs` go to every constructor. max_concurrency > 1: calls
    run on that many threads at once (a rollout replica taking a weight push while it generates)."""
    return [
        start_process(
            pool, group, rank, build(rank), threads=threads, max_concurrency=max_concurrency, **kwargs
        )
        for rank in range(pool.world_size)
    ]


def start_process(
    pool: ResourcePool,
    group: PlacementGroup,
    rank: int,
    build: WorkerBuild,
    *,
    threads: int | None,
    max_concurrency: int = 1,
    **kwargs: Any,
) -> Any:
    """The `RankProcess` actor of bundle `rank` of `pool` (`start_processes`; a rollout replica's
    replacement is started on its bundle again)."""
    process = ray.remote(RankProcess)
    return process.options(**actor_options(pool, group, rank), max_concurrency=max_concurrency).remote(
        rank=rank,
        world_size=pool.world_size,
        threads=threads or pool.bundles[rank].threads,
        build=build,
        **kwargs,
    )


def start_ranks(
    role: str,
    build: WorkerBuild,
    pool: ResourcePool,
    group: PlacementGroup,
    *,
    threads: int | None,
    timeout_s: float,
    backend: str = "gloo",
) -> RayRanks:
    """The role's ranks, one per bundle of `pool`, met and joined into the role's group, each holding
    the worker `build(distributed=True)` makes there."""
    actors = start_processes(
        pool, group, lambda rank: build, threads=threads, timeout_s=timeout_s, backend=backend
    )
    ranks = RayRanks(role, actors, timeout_s=timeout_s)
    nodes = ranks.nodes = ranks.call_processes("init", RankProcess.node_id)
    ((address, port),) = ranks.call_processes(
        "init", RankProcess.rendezvous_address, len(set(nodes)) == 1, ranks=[0]
    )
    ranks.call_processes("init", RankProcess.join, address, port)  # rank 0 chose; every rank meets there
    return ranks
