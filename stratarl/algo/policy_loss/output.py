"""Layer 6, RL math: what every policy loss returns, a per-token loss and its metrics.

Aggregation to a scalar is a separate, visible step (`stratarl.algo.aggregation.aggregate_loss`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor


@dataclass(frozen=True)
class PolicyLossOutput:
    """per_token_loss [N, T]: the loss of each token, before the response mask and aggregation
    (masked positions may hold anything). metrics: verl's metric names without the
    `actor/` prefix (`pg_clipfrac`, `ppo_kl`, `pg_clipfrac_lower`), detached scalar tensors; shares
    of tokens are averaged from float32 indicators, as verl does."""

    per_token_loss: Tensor
    metrics: dict[str, Tensor] = field(default_factory=dict)
