"""Layer 6, RL math: advantage estimators, and the registry the trainer picks one from by name.

Every estimator is a plain function returning (advantages [N, T], returns [N, T]). Its entry in
`ADVANTAGE_ESTIMATORS` says which batch fields it reads and which hyper-parameters it takes, so
the trainer can check the batch and pass exactly those; where an entry has `statistics`, that
function returns the per-row numbers the estimator computed the advantage from (for the
trace). Names are verl's `algorithm.adv_estimator`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from stratarl.algo.advantages.discounted_return import reinforce_plus_plus_advantages, remax_advantages
from stratarl.algo.advantages.gae import gae_advantages
from stratarl.algo.advantages.group_baseline import (
    gpg_advantages,
    opo_advantages,
    reinforce_plus_plus_baseline_advantages,
    rloo_advantages,
    rloo_vectorized_advantages,
)
from stratarl.algo.advantages.group_relative import (
    gdpo_advantages,
    grpo_advantages,
    grpo_passk_advantages,
    grpo_statistics,
)
from stratarl.algo.advantages.optimal_token_baseline import (
    optimal_token_baseline_advantages,
    tir_optimal_token_baseline_advantages,
)
from stratarl.algo.registry import look_up


@dataclass(frozen=True)
class AdvantageEstimator:
    """An estimator function with the batch fields it reads and the hyper-parameters it accepts."""

    fn: Callable[..., tuple[Tensor, Tensor]]
    inputs: frozenset[str]  # batch fields that must be present
    optional_inputs: frozenset[str] = frozenset()  # batch fields passed when present
    hyperparameters: frozenset[str] = frozenset()  # keyword arguments with verl's defaults
    # Same inputs and hyper-parameters as `fn`; returns the per-row numbers Â was computed from.
    statistics: Callable[..., dict[str, Any]] | None = None

    def __call__(self, batch: Mapping[str, Any], **hyperparameters: Any) -> tuple[Tensor, Tensor]:
        """Run the estimator on `batch` (any mapping of field name -> value), checking what it needs."""
        return self.fn(**self._arguments(batch, hyperparameters))

    def explain(self, batch: Mapping[str, Any], **hyperparameters: Any) -> dict[str, Any] | None:
        """`statistics` on the same arguments as a call (None for an estimator without them)."""
        if self.statistics is None:
            return None
        return self.statistics(**self._arguments(batch, hyperparameters))

    def accepted(self, hyperparameters: Mapping[str, Any]) -> dict[str, Any]:
        """The hyper-parameters this estimator takes, without unset (None) ones: those keep the default."""
        return {k: v for k, v in hyperparameters.items() if k in self.hyperparameters and v is not None}

    def _arguments(self, batch: Mapping[str, Any], hyperparameters: Mapping[str, Any]) -> dict[str, Any]:
        missing = sorted(self.inputs - set(batch.keys()))
        if missing:
            raise KeyError(f"{self.fn.__name__} needs batch fields {missing}, which are missing")
        unknown = sorted(set(hyperparameters) - self.hyperparameters)
        if unknown:
            raise TypeError(
                f"{self.fn.__name__} takes hyper-parameters {sorted(self.hyperparameters)}, not {unknown}"
            )
        fields = {name: batch[name] for name in self.inputs}
        fields.update({name: batch[name] for name in self.optional_inputs if name in batch})
        return fields | dict(hyperparameters)


_OUTCOME = frozenset({"token_level_rewards", "response_mask"})
_GROUPED = _OUTCOME | {"group"}
_NORMALIZED = frozenset({"norm_adv_by_std", "eps"})
_GRPO = AdvantageEstimator(grpo_advantages, _GROUPED, hyperparameters=_NORMALIZED, statistics=grpo_statistics)
_OTB_INPUTS = _GROUPED | {"old_log_prob", "sum_pi_squared"}
_OTB_HYPERPARAMETERS = frozenset({"handle_zero_tail", "eps"})

ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {
    "gae": AdvantageEstimator(
        gae_advantages, _OUTCOME | {"values"}, hyperparameters=frozenset({"gamma", "lam"})
    ),
    "grpo": _GRPO,
    "grpo_vectorized": _GRPO,  # verl computes the same quantity with scatter ops; ours always does
    "grpo_passk": AdvantageEstimator(grpo_passk_advantages, _GROUPED, hyperparameters=_NORMALIZED),
    "gdpo": AdvantageEstimator(
        gdpo_advantages,
        frozenset({"component_scores", "response_mask", "group"}),
        hyperparameters=_NORMALIZED | {"weights"},
    ),
    "rloo": AdvantageEstimator(rloo_advantages, _GROUPED),
    "rloo_vectorized": AdvantageEstimator(rloo_vectorized_advantages, _GROUPED),
    "opo": AdvantageEstimator(opo_advantages, _GROUPED),
    "gpg": AdvantageEstimator(gpg_advantages, _GROUPED, hyperparameters=frozenset({"f_norm"})),
    "reinforce_plus_plus_baseline": AdvantageEstimator(reinforce_plus_plus_baseline_advantages, _GROUPED),
    "reinforce_plus_plus": AdvantageEstimator(
        reinforce_plus_plus_advantages, _OUTCOME, hyperparameters=frozenset({"gamma"})
    ),
    "remax": AdvantageEstimator(remax_advantages, _OUTCOME | {"reward_baselines"}),
    "optimal_token_baseline": AdvantageEstimator(
        optimal_token_baseline_advantages,
        _OTB_INPUTS,
        optional_inputs=frozenset({"rollout_is_weights"}),
        hyperparameters=_OTB_HYPERPARAMETERS,
    ),
    "tir_optimal_token_baseline": AdvantageEstimator(
        tir_optimal_token_baseline_advantages,
        _OTB_INPUTS,
        optional_inputs=frozenset({"rollout_is_weights"}),
        hyperparameters=_OTB_HYPERPARAMETERS,
    ),
}


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    """The registered estimator called `name`; ValueError naming the valid ones (and the closest)."""
    return look_up(ADVANTAGE_ESTIMATORS, name, "advantage estimator")


__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AdvantageEstimator",
    "gae_advantages",
    "gdpo_advantages",
    "get_advantage_estimator",
    "gpg_advantages",
    "grpo_advantages",
    "grpo_passk_advantages",
    "opo_advantages",
    "optimal_token_baseline_advantages",
    "reinforce_plus_plus_advantages",
    "reinforce_plus_plus_baseline_advantages",
    "remax_advantages",
    "rloo_advantages",
    "rloo_vectorized_advantages",
    "tir_optimal_token_baseline_advantages",
]
