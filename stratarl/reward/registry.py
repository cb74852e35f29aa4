"""Layer 5, rewards: the registry from a dataset's `data_source` to its scoring function.

Every scorer has verl's signature `compute_score(data_source, solution_str, ground_truth,
extra_info=None) -> float | dict` (a dict carries `score` plus extra keys that become metrics).
The registry is a plain dict; add an entry to teach the default dispatcher a new data source.
Heavy scorers (math-verify imports sympy, ~2 s) are imported on first use, through `LazyScorer`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from stratarl.reward import arithmetic, gsm8k, tool_arithmetic

ScoreFn = Callable[..., "float | dict[str, Any]"]


class LazyScorer:
    """`module:function`, imported on the first call; picklable by name for worker processes."""

    def __init__(self, module: str, function: str = "compute_score") -> None:
        self.module, self.function = module, function

    def __call__(self, *args: Any, **kwargs: Any) -> float | dict[str, Any]:
        return getattr(importlib.import_module(self.module), self.function)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"LazyScorer({self.module}:{self.function})"


_MATH = LazyScorer("stratarl.reward.math_answer")
_CODE = LazyScorer("stratarl.reward.code_exec")
_MATH_SOURCES = ("math", "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
_CODE_SOURCES = ("code", "codecontests", "apps", "taco", "codeforces")

SCORERS: dict[str, ScoreFn] = {
    arithmetic.DATA_SOURCE: arithmetic.compute_score,
    tool_arithmetic.DATA_SOURCE: tool_arithmetic.compute_score,
    **{source: gsm8k.compute_score for source in gsm8k.DATA_SOURCES},
    **{source: _MATH for source in _MATH_SOURCES},
    **{source: _CODE for source in _CODE_SOURCES},
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
