"""Layer 6, RL math: policy losses. Each loss returns a per-token loss [N, T] and its metrics
(`PolicyLossOutput`); aggregation to a scalar is the separate step `aggregate_loss`.

Owns the registry `POLICY_LOSSES` (verl 0.9.1's `policy_loss.loss_mode` names, plus `reinforce`)
and `compute_policy_loss`, which composes a loss with its aggregation the way verl does.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from stratarl.algo.aggregation import Count, aggregate_loss
from stratarl.algo.policy_loss.covariance import clip_cov_loss, kl_cov_loss
from stratarl.algo.policy_loss.dppo import dppo_kl_loss, dppo_tv_loss
from stratarl.algo.policy_loss.gradient import cispo_loss, dro_loss, gpg_loss, reinforce_loss
from stratarl.algo.policy_loss.output import PolicyLossOutput
from stratarl.algo.policy_loss.ppo_clip import ppo_clip_loss
from stratarl.algo.policy_loss.sequence_ratio import geo_mean_loss, gspo_loss
from stratarl.algo.policy_loss.soft_gate import sapo_loss
from stratarl.algo.registry import look_up

_TENSOR_ARGUMENTS = ("log_prob", "old_log_prob", "advantages", "response_mask", "rollout_is_weights")


@dataclass(frozen=True)
class PolicyLoss:
    """A registered policy loss and how verl aggregates it.

    fn: keyword-only (log_prob, old_log_prob, advantages, response_mask, rollout_is_weights,
    **hyper-parameters) -> PolicyLossOutput.
    forced_aggregation: the mode verl uses for this loss whatever `loss_agg_mode` says (None: the
    actor's `loss_agg_mode`).
    local_row_mean: verl reduces this loss as a plain mean over the N rows of the batch it sees,
    ignoring dp_size and the global counts; the composed loss then uses dp_size=1 and
    global_batch_size=N.
    """

    fn: Callable[..., PolicyLossOutput]
    forced_aggregation: str | None = None
    local_row_mean: bool = False

    @property
    def hyperparameters(self) -> tuple[str, ...]:
        """Names of the keyword hyper-parameters `fn` accepts (what a builder may pass)."""
        names = inspect.signature(self.fn).parameters
        return tuple(name for name in names if name not in _TENSOR_ARGUMENTS)


POLICY_LOSSES: dict[str, PolicyLoss] = {
    "vanilla": PolicyLoss(ppo_clip_loss),
    "gspo": PolicyLoss(gspo_loss),  # 0.9.1: the actor's mode; up to 0.9.0 forced seq-mean-token-mean
    "geo_mean": PolicyLoss(geo_mean_loss, forced_aggregation="seq-mean-token-sum", local_row_mean=True),
    "sapo": PolicyLoss(sapo_loss, forced_aggregation="seq-mean-token-mean"),
    "clip_cov": PolicyLoss(clip_cov_loss),
    "kl_cov": PolicyLoss(kl_cov_loss),
    "gpg": PolicyLoss(gpg_loss),
    "cispo": PolicyLoss(cispo_loss),
    "dro": PolicyLoss(dro_loss),
    "dppo_tv": PolicyLoss(dppo_tv_loss),
    "dppo_kl": PolicyLoss(dppo_kl_loss),
    # Not a verl loss_mode: the REINFORCE/IS loss that verl's bypass mode dispatches to.
    "reinforce": PolicyLoss(reinforce_loss),
}


def get_policy_loss(name: str) -> PolicyLoss:
    """The loss registered under `name`; ValueError naming the valid names otherwise."""
    return look_up(POLICY_LOSSES, name, "policy loss")


def compute_policy_loss(
    name: str,
    *,
    log_prob: Tensor,  # [N, T]
    old_log_prob: Tensor,  # [N, T]
    advantages: Tensor,  # [N, T]
    response_mask: Tensor,  # [N, T]
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: Tensor | None = None,  # [N, T]
    dp_size: int = 1,
    global_num_tokens: Count | None = None,
    global_batch_size: Count | None = None,
    loss_scale_factor: float | None = None,
    **hyperparameters: object,
) -> tuple[Tensor, dict[str, Tensor]]:
    """(scalar loss, metrics) as verl's `compute_policy_loss_<name>` returns them: the per-token loss
    of `name`, aggregated with the loss's forced mode or else `loss_agg_mode`.

    hyperparameters go to the loss unchanged (an unknown name raises TypeError); the normalizers
    go to `aggregate_loss`.
    """
    entry = get_policy_loss(name)
    output = entry.fn(
        log_prob=log_prob,
        old_log_prob=old_log_prob,
        advantages=advantages,
        response_mask=response_mask,
        rollout_is_weights=rollout_is_weights,
        **hyperparameters,
    )
    mode = entry.forced_aggregation or loss_agg_mode
    if entry.local_row_mean:
        normalizers = {"dp_size": 1, "global_batch_size": log_prob.shape[0]}
    else:
        normalizers = {
            "dp_size": dp_size,
            "global_num_tokens": global_num_tokens,
            "global_batch_size": global_batch_size,
            "loss_scale_factor": loss_scale_factor,
        }
    loss = aggregate_loss(output.per_token_loss, response_mask, mode, **normalizers)
    return loss, output.metrics


__all__ = [
    "POLICY_LOSSES",
    "PolicyLoss",
    "PolicyLossOutput",
    "compute_policy_loss",
    "get_policy_loss",
]
