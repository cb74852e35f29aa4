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

from stratarl.cluster.critic_worker import CriticWorker, load_critic
from stratarl.cluster.queue_shard import QueueReader
from stratarl.cluster.rank_process import RankProcess
from stratarl.engine.data_parallel import DataParallel


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


class CriticRank(CriticWorker, QueueReader, RankProcess):
    """Rank `rank` of the critic's `world_size`, started by `rank_process.start_ranks` like
    `PolicyRank`: the constructor sets this process's threads (the bundle's, which it takes turns
    on with the policy's process); `join` joins the critic's own group and calls `build`.

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
        self.set_up(rank=rank, world_size=world_size, threads=threads, backend=backend, timeout_s=timeout_s)
        self.spec = spec
        self.critic = None

    def build(self, dp: DataParallel) -> None:
        """Load the value model and shard it over the critic's group. Every rank draws the same fresh
        head (`init_seed`): FSDP2 keeps rank r's slice of rank r's copy."""
        spec = self.spec
        self.critic = load_critic(
            spec.model_path,
            spec.critic_kwargs,
            spec.dtype,
            init_seed=0 if spec.init_seed is None else spec.init_seed,
            data_parallel=dp,
        )
