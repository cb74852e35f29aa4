"""Layer 3, orchestration: what the rank processes of a role share, and how a role's ranks start.

A rank (`PolicyRank`, `CriticRank`) is a Ray actor built in two steps, because the ranks of a
role must meet before any model is sharded over them:

1. the constructor (`RankProcess.set_up`) only sets this process's torch threads from its CPU share;
2. `start_ranks` asks every rank for its node, lets rank 0 choose where the group meets
   (`rendezvous_address`: loopback when all ranks share a node), and has every rank `join` there at
   once; joining builds the role's sharded models (`build`, each role's own).

Each role forms its own torch.distributed group (gloo on CPU, nccl on GPU): a critic's ranks never
meet the policy's.
"""

from __future__ import annotations

from typing import Any

import ray
import torch
import transformers
from ray.util.placement_group import PlacementGroup

from stratarl.cluster.placement import ResourcePool
from stratarl.cluster.ranks import RayRanks
from stratarl.cluster.ray_cluster import actor_options
from stratarl.engine.data_parallel import DataParallel
from stratarl.engine.process_group import free_port, join_process_group, leave_process_group
from stratarl.observe.stack_dumps import arm_stack_dumps


class RankProcess:
    """Mixin of a role's rank actor: this process's threads, the rendezvous, the group."""

    def set_up(self, *, rank: int, world_size: int, threads: int, backend: str, timeout_s: float) -> None:
        transformers.logging.disable_progress_bar()  # no per-process load bars in the driver log
        torch.set_num_threads(threads)  # this process's CPU share: never more threads than cores
        self.rank, self.world_size = rank, world_size
        self.backend, self.timeout_s = backend, timeout_s

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def rendezvous_address(self, loopback: bool) -> tuple[str, int]:
        """Where the group meets: this node's address (loopback when every rank is on this node)
        and a port free here now."""
        host = "127.0.0.1" if loopback else ray.util.get_node_ip_address()
        return host, free_port(host)

    def join(self, address: str, port: int) -> None:
        """Join the role's process group, then build the role's models sharded over it."""
        join_process_group(
            address=address,
            port=port,
            rank=self.rank,
            world_size=self.world_size,
            backend=self.backend,
            timeout_s=self.timeout_s,
        )
        self.build(DataParallel.over_world())

    def build(self, dp: DataParallel) -> None:
        raise NotImplementedError(f"{type(self).__name__} must build its models in build(dp)")

    def leave(self) -> None:
        leave_process_group()

    def register_stack_dump(self, folder: str, role: str) -> dict[str, object]:
        """faulthandler on SIGUSR1 from now on: this rank's stacks into `folder` (`stack_dumps`)."""
        return arm_stack_dumps(folder, role, self.rank)


def start_ranks(
    role: str,
    rank_class: type,
    pool: ResourcePool,
    group: PlacementGroup,
    *,
    threads: int | None,
    timeout_s: float,
    **kwargs: Any,
) -> RayRanks:
    """One `rank_class` actor per bundle of `pool` (rank r on bundle r, threads from its share unless
    `threads`), met and joined into the role's group; `kwargs` go to every rank's constructor."""
    rank_actor = ray.remote(rank_class)
    actors = [
        rank_actor.options(**actor_options(pool, group, rank)).remote(
            rank=rank,
            world_size=pool.world_size,
            threads=threads or bundle.threads,
            timeout_s=timeout_s,
            **kwargs,
        )
        for rank, bundle in enumerate(pool.bundles)
    ]
    ranks = RayRanks(role, actors, timeout_s=timeout_s)
    nodes = ranks.call_all("init", "node_id")
    address, port = ranks.call_rank(0, "init", "rendezvous_address", len(set(nodes)) == 1)
    ranks.call_all("init", "join", address, port)  # rank 0 chose; every rank meets there
    return ranks
