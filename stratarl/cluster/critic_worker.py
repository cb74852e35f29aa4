"""Layer 3, orchestration: the critic worker — the value model of PPO, in its own role.

verl's `CriticWorker`: a separate role from the policy because it trains a separate model (a causal
LM body with a scalar head, `engine.critic`). The trainer calls it through these methods only:
`compute_values` before the advantage, `update_critic` with the value loss the trainer built.
"""

from __future__ import annotations

from pathlib import Path

from stratarl.cluster.policy_worker import DTYPES
from stratarl.engine.critic import Critic, load_value_model
from stratarl.engine.training import LossFn
from stratarl.transport.data_proto import DataProto


class CriticWorker:
    """A `Critic` over a model directory: a causal LM (its body gets a fresh scalar head, as verl does
    when the critic starts from the actor's checkpoint) or a saved value model."""

    def __init__(self, *, model_path: str | Path, critic_kwargs: dict, dtype: str = "float32"):
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; valid: {sorted(DTYPES)}")
        self.critic = Critic(load_value_model(model_path, DTYPES[dtype]), **critic_kwargs)

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
        out_dir = Path(out_dir)
        self.critic.model.save_pretrained(out_dir)
        return out_dir
