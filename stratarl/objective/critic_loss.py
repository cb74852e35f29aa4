"""RL math, composed: the critic's objective, composed from `algo/` for the engine.

    L_V = agg(½ · max((V_θ − R)², (clip(V_θ, V_old − c, V_old + c) − R)²))

with R the returns of the advantage estimator (GAE: A + V_old), V_old the values computed before the
update, c = critic.cliprange_value and agg the critic's loss_agg_mode with the mini-batch totals as
global normalisers — the same visible aggregation as the actor's loss (`actor_loss.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from stratarl.algo.aggregation import aggregate_loss
from stratarl.algo.masked import masked_mean
from stratarl.algo.value_loss import clipped_value_loss
from stratarl.transport.data_proto import DataProto


@dataclass(frozen=True)
class ValueLoss:
    """A LossFn (see `stratarl.engine.training.LossFn`) for the critic: reads `returns`, `values`."""

    cliprange_value: float = 0.5
    loss_agg_mode: str = "token-mean"

    @property
    def reads(self) -> tuple[str, ...]:
        """The batch columns `__call__` reads (besides the model's inputs)."""
        return ("response_mask", "returns", "values")

    def __call__(self, micro: DataProto, scores, totals) -> tuple[Tensor, dict[str, float]]:
        mask = micro["response_mask"]  # [m, T]
        share = float(mask.sum()) * totals.dp_size / max(totals.num_tokens, 1)
        per_token, stats = clipped_value_loss(
            scores.values, micro["returns"], micro["values"], mask, cliprange_value=self.cliprange_value
        )
        loss = aggregate_loss(
            per_token,
            mask,
            self.loss_agg_mode,
            dp_size=totals.dp_size,
            global_num_tokens=totals.num_tokens,
            global_batch_size=totals.num_sequences,
        )
        vpred_mean = masked_mean(scores.values.detach(), mask)
        return loss, {
            "critic/vf_loss": loss.item(),
            "critic/vf_clipfrac": float(stats["vf_clipfrac"]) * share,
            "critic/vpred_mean": float(vpred_mean) * share,
        }
