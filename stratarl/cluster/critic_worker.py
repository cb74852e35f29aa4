"""Layer 3, orchestration: the critic worker — the value model of PPO, in its own role.

verl's `CriticWorker`: a separate role from the policy because it trains a separate model (a causal
LM body with a scalar head, `engine.critic`). It is built one way, from a `CriticSpec`, in this
process or on a Ray rank that has joined the critic's own process group (`distributed=True`: the
value model is sharded with FSDP2 over it); the rank holds this object. The trainer calls it
through a `CriticWorkerGroup`: `compute_values` before the advantage, `update_critic` with the value
loss the trainer built, and the checkpoint pair (`stage_checkpoint` writes its part ahead of the
policy's atomic save, `load_checkpoint` restores it from the step the policy's load chose).
"""

from __future__ import annotations

from pathlib import Path

import torch

from stratarl.cluster.policy_worker import data_parallel
from stratarl.cluster.specs import CriticSpec
from stratarl.engine.checkpoint import CheckpointManager
from stratarl.engine.critic import Critic, load_value_model
from stratarl.engine.host_memory import use_host_allocator
from stratarl.engine.lora import strip_prefix
from stratarl.engine.requests import UpdateRequest
from stratarl.engine.training import LossFn
from stratarl.transport.data_proto import DataProto

CHECKPOINT_ROLE = "critic"  # its directory in a checkpoint


class CriticWorker:
    """A `Critic` over a model directory: a causal LM (its body gets a fresh scalar head, as verl does
    when the critic starts from the actor's checkpoint) or a saved value model."""

    def __init__(self, spec: CriticSpec, *, distributed: bool = False):
        self.spec = spec
        use_host_allocator(spec.model.host_allocator)
        dp = data_parallel(spec.precision, distributed=distributed)
        # A fresh head is drawn from init_seed without touching the global RNG: data-parallel ranks
        # must draw the same head (seed 0 when none is given), since FSDP2 keeps rank r's slice of
        # rank r's copy.
        seed = 0 if spec.init_seed is None and distributed else spec.init_seed
        with torch.random.fork_rng(devices=[], enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            model = load_value_model(
                spec.model.path, spec.model.torch_dtype, trust_remote_code=spec.model.trust_remote_code
            ).to(spec.model.device)
        b = spec.batching
        self.critic = Critic(
            model,
            optim=spec.optimizer,
            micro_batch_size=b.micro_batch_size,
            max_tokens_per_micro_batch=b.max_tokens_per_micro_batch,
            layout=b.layout,
            gradient_checkpointing=spec.model.gradient_checkpointing,
            data_parallel=dp,
        )

    def compute_values(self, batch: DataProto) -> DataProto:
        """[N, T] V(s_t) of every response token under the current critic (`values`)."""
        return DataProto.from_dict({"values": self.critic.compute_values(batch)})

    def update_critic(self, batch: DataProto, loss_fn: LossFn, request: UpdateRequest) -> dict[str, float]:
        return self.critic.update(batch, loss_fn, request)

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
