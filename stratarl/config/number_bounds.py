"""Layer 1, config: numbers a run can hold — every float finite, every int within 32 bits, seeds in
[0, 2^32), checked for every setting of the schema before the settings' own ranges.

Without this, `actor.lr=inf` or `rollout.max_response_tokens=100000000000000000000` passed validation
and failed only after the model loaded (an optimizer of NaNs, an overflow in a tensor's size).
"""

from __future__ import annotations

import math
from typing import Any

from stratarl.config.errors import ConfigProblem
from stratarl.config.schema_run import RunConfig
from stratarl.config.setting import get_by_key, leaf_settings

INT_MIN, INT_MAX = -(2**31), 2**31 - 1  # int32: what torch, numpy and the engines index with
SEED_LIMIT = 2**32  # numpy's seeds are unsigned 32-bit


def number_problems(cfg: RunConfig) -> list[ConfigProblem]:
    """A problem for each number (or number in a list) of `cfg` outside what a run can hold."""
    problems = []
    for key, info in leaf_settings(RunConfig).items():
        if info.accepts_any_subkey:
            continue  # a free-form dict of the user's (e.g. reward.function_kwargs)
        value = get_by_key(cfg, key)
        for item in value if isinstance(value, list | tuple) else [value]:
            why = _number_problem(key, item)
            if why:
                problems.append(ConfigProblem((key,), f"{why}, got {item!r}"))
                break
    return problems


def _number_problem(key: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return ""
    if isinstance(value, float):
        return "" if math.isfinite(value) else "must be a finite number"
    if key.rsplit(".", 1)[-1] == "seed":
        return "" if 0 <= value < SEED_LIMIT else "a seed must be in [0, 2^32)"
    return "" if INT_MIN <= value <= INT_MAX else f"must fit in 32 bits ([{INT_MIN}, {INT_MAX}])"
