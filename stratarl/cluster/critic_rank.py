"""Layer 3, orchestration: one data-parallel rank of the critic, in a process of its own (a Ray actor).

`CriticSpec` is what builds a critic worker (the keyword arguments of `CriticWorker`), shared by the
in-process backend and this one. `CriticRank` is a `CriticWorker` whose value model is sharded with
FSDP2 over a torch.distributed group of the critic's ranks only (gloo on CPU, nccl on GPU) — its
own rendezvous, separate from the policy's group, because it lives in other processes. The
inherited methods (compute_values, update_critic, the checkpoint pair) run unchanged on this
rank's share of rows, handed over directly or read from the TransferQueue (`run_on_queue`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import ray
import torch
import transformers

from stratarl.cluster.critic_worker import CriticWorker, load_critic
from stratarl.cluster.queue_shard import QueueReader
from stratarl.engine.data_parallel import DataParallel
from stratarl.engine.process_group import free_port, join_process_group, leave_process_group


@dataclass(frozen=True)
class CriticSpec:
    """The keyword arguments of `CriticWorker`: a model directory, the critic's settings, and the
    seed of a fresh value head (None: the global RNG, in one process; ranks use 0 then)."""

    model_path: str
    critic_kwargs: dict = field(default_factory=dict)
    dtype: str = "float32"
    init_seed: int | None = None

    def worker_kwargs(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


class CriticRank(CriticWorker, QueueReader):
    """Rank `rank` of the critic's `world_size`. Built in two steps, like `PolicyRank`: the
    constructor only sets this process's threads (the bundle's, which it takes turns on with the
    policy's process); `join(address, port)`, called on every rank at once with the address rank 0
    chose, joins the critic's group and builds the sharded value model.

    `CriticWorker.__init__` is not run (the model must be built after the group exists), but the
    same attribute (`critic`) is set, so the inherited methods apply.
    """

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        threads: int,
        spec: CriticSpec,
        backend: str = "gloo",
        timeout_s: float = 600.0,
    ):
        transformers.logging.disable_progress_bar()  # no per-process load bars in the driver log
        torch.set_num_threads(threads)  # this process's CPU share: never more threads than cores
        self.rank, self.world_size, self.spec = rank, world_size, spec
        self.backend, self.timeout_s = backend, timeout_s
        self.critic = None

    # --- start-up --------------------------------------------------------------------------------
    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def rendezvous_address(self, loopback: bool) -> tuple[str, int]:
        """Where the critic's group meets: this node's address (loopback when every rank is on this
        node) and a port free here now."""
        host = "127.0.0.1" if loopback else ray.util.get_node_ip_address()
        return host, free_port(host)

    def join(self, address: str, port: int) -> None:
        """Join the critic's process group, then load the value model and shard it over the group.
        Every rank draws the same fresh head (`init_seed`): FSDP2 keeps rank r's slice of rank r's copy."""
        join_process_group(
            address=address,
            port=port,
            rank=self.rank,
            world_size=self.world_size,
            backend=self.backend,
            timeout_s=self.timeout_s,
        )
        spec = self.spec
        self.critic = load_critic(
            spec.model_path,
            spec.critic_kwargs,
            spec.dtype,
            init_seed=0 if spec.init_seed is None else spec.init_seed,
            data_parallel=DataParallel.over_world(),
        )

    def leave(self) -> None:
        leave_process_group()
