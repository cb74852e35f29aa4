"""Layer 5, rewards: the registry from a dataset's `data_source` to its scoring function.

Every scorer has verl's signature `compute_score(data_source, solution_str, ground_truth,
extra_info=None) -> float | dict` (a dict carries `score` plus extra keys that become metrics).
The registry is a plain dict; add an entry to teach the default dispatcher a new data source.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from stratarl.reward import arithmetic

ScoreFn = Callable[..., "float | dict[str, Any]"]

SCORERS: dict[str, ScoreFn] = {
    arithmetic.DATA_SOURCE: arithmetic.compute_score,
}


class UnknownDataSourceError(KeyError):
    """No scorer is registered for a data source: a setup error, never a per-sample failure."""

    def __str__(self) -> str:
        return str(self.args[0])


def scorer_for(data_source: str, scorers: Mapping[str, ScoreFn] | None = None) -> ScoreFn:
    """The scoring function registered for `data_source`; raises naming the known sources."""
    table = SCORERS if scorers is None else scorers
    if data_source not in table:
        known = ", ".join(sorted(table)) or "(none)"
        raise UnknownDataSourceError(
            f"no reward function for data_source {data_source!r}; registered: {known}. "
            "Register one in stratarl.reward.registry.SCORERS or pass a custom function by path."
        )
    return table[data_source]


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> float | dict[str, Any]:
    """Dispatch on `data_source` through `SCORERS` (verl's `default_compute_score` role)."""
    return scorer_for(data_source)(data_source, solution_str, ground_truth, extra_info)
