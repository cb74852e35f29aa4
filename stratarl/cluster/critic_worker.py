"""Layer 3, orchestration: the critic worker — the value model of PPO, in its own role.

verl's `CriticWorker`: a separate role from the policy because it trains a separate model (a causal
LM body with a scalar head, `engine.critic`). The trainer calls it through these methods only:
`compute_values` before the advantage, `update_critic` with the value loss the trainer built, and
the checkpoint pair (`stage_checkpoint` writes its part ahead of the policy's atomic save,
`load_checkpoint` restores it from the step the policy's load chose; see `run_checkpoint`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from stratarl.cluster.policy_worker import DTYPES
from stratarl.engine.checkpoint import CheckpointManager
from stratarl.engine.critic import Critic, load_value_model
from stratarl.engine.data_parallel import DataParallel
from stratarl.engine.lora import strip_prefix
from stratarl.engine.training import LossFn
from stratarl.transport.data_proto import DataProto

CHECKPOINT_ROLE = "critic"  # its directory in a checkpoint


def load_critic(
    model_path: str | Path,
    critic_kwargs: dict[str, Any],
    dtype: str = "float32",
    *,
    init_seed: int | None = None,
    data_parallel: DataParallel | None = None,
) -> Critic:
    """A `Critic` over `model_path`. A causal LM gets a fresh scalar head, drawn from the global RNG
    (None) or from `init_seed` without touching it — data-parallel ranks must draw the same head,
    since FSDP2 shards each rank's own copy."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid: {sorted(DTYPES)}")
    with torch.random.fork_rng(devices=[], enabled=init_seed is not None):
        if init_seed is not None:
            torch.manual_seed(init_seed)
        model = load_value_model(model_path, DTYPES[dtype])
    return Critic(model, **critic_kwargs, data_parallel=data_parallel)


class CriticWorker:
    """A `Critic` over a model directory: a causal LM (its body gets a fresh scalar head, as verl does
    when the critic starts from the actor's checkpoint) or a saved value model."""

    def __init__(
        self,
        *,
        model_path: str | Path,
        critic_kwargs: dict,
        dtype: str = "float32",
        init_seed: int | None = None,
    ):
        self.critic = load_critic(model_path, critic_kwargs, dtype, init_seed=init_seed)

    def compute_values(self, batch: DataProto) -> DataProto:
        """[N, T] V(s_t) of every response token under the current critic (`values`)."""
        return DataProto.from_dict({"values": self.critic.compute_values(batch)})

    def update_critic(
        self,
        batch: DataProto,
        loss_fn: LossFn,
        *,
        mini_batch_size: int,
        epochs: int = 1,
        shuffle_seed: int | None = None,
    ) -> dict[str, float]:
        return self.critic.update(
            batch, loss_fn, mini_batch_size=mini_batch_size, epochs=epochs, shuffle_seed=shuffle_seed
        )

    def save_pretrained(self, out_dir: str | Path) -> Path:
        """The value model as an HF directory; a collective when sharded (the full weights are
        gathered), rank 0 writes."""
        critic, out_dir = self.critic, Path(out_dir)
        state = strip_prefix(critic.dp.full_model_state(critic.module), "value_model.")
        if critic.dp.rank == 0:
            critic.model.save_pretrained(out_dir, state_dict=state)
        critic.dp.barrier()
        return out_dir

    # --- checkpoints: the critic's part of the run's atomic save ---------------------------------
    def stage_checkpoint(self, root: str | Path, step: int) -> Path:
        """Write the critic's model, optimizer and schedule for checkpoint `step` into its staging
        directory; the policy's save moves it in (`CheckpointManager.stage_role`). A collective."""
        return CheckpointManager(root, dp=self.critic.dp).stage_role(step, CHECKPOINT_ROLE, self.critic)

    def load_checkpoint(self, root: str | Path, step: int) -> None:
        """Restore the critic from checkpoint `step`, which the policy's load chose and verified."""
        CheckpointManager(root, dp=self.critic.dp).load_role(step, CHECKPOINT_ROLE, self.critic)

    # --- the worker as a group of one (the interface `critic_group.CriticWorkerGroup` shares) -------
    def controller_bytes(self) -> dict[str, float]:
        """Bytes between the controller and other processes: none, everything is in this one."""
        return {"controller/sent_bytes": 0.0, "controller/received_bytes": 0.0}

    def arm_stack_dumps(self, folder: str | Path) -> list[str]:
        """Nothing to arm: this worker is the controller's process, which the watchdog dumps itself."""
        return []

    def dump_stacks(self, folder: str | Path, header: str) -> list[str]:
        return []

    def shutdown(self) -> None:
        """Nothing to stop: the model lives as long as this process holds it."""
