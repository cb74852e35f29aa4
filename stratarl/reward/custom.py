"""Layer 5, rewards: a user's scoring function loaded from a Python file by path and name.

The file is executed as a fresh module (it need not be on `sys.path`); the function must have
verl's signature `compute_score(data_source, solution_str, ground_truth, extra_info=None)`.
Keyword arguments given here are bound to it, like verl's `custom_reward_function.reward_kwargs`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
from pathlib import Path
from typing import Any

from stratarl.reward.registry import ScoreFn


def load_custom_scorer(path: str | Path, function_name: str, **bound_kwargs: Any) -> ScoreFn:
    """Import `path` and return its `function_name`, with `bound_kwargs` applied.

    Errors name the path and the function: a missing file (FileNotFoundError), a file that fails
    to import (ImportError, chained to the original), a missing or non-callable attribute
    (AttributeError / TypeError listing the callables the file does define).
    """
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise FileNotFoundError(f"custom reward file not found: {file} (looking for {function_name!r})")
    # A name unique per file, so two reward files with the same stem do not shadow each other.
    digest = hashlib.sha1(str(file).encode()).hexdigest()[:10]
    spec = importlib.util.spec_from_file_location(f"stratarl_custom_reward_{file.stem}_{digest}", file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {file} as a Python module (looking for {function_name!r})")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        raise ImportError(f"importing custom reward file {file} failed: {err!r}") from err

    defined = sorted(
        name for name, value in vars(module).items() if callable(value) and not name.startswith("_")
    )
    if not hasattr(module, function_name):
        raise AttributeError(
            f"custom reward file {file} has no function {function_name!r}; it defines: "
            f"{', '.join(defined) or '(no public callables)'}"
        )
    function = getattr(module, function_name)
    if not callable(function):
        raise TypeError(f"{function_name!r} in {file} is a {type(function).__name__}, not a function")
    return functools.partial(function, **bound_kwargs) if bound_kwargs else function
