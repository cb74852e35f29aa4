"""Layer 5, rewards: a user's scoring function loaded from a Python file by path and name.

The file is executed as a fresh module (it need not be on `sys.path`); the function must have
verl's signature `compute_score(data_source, solution_str, ground_truth, extra_info=None)`, and may
be `async def`. Keyword arguments given here are bound to it, like verl's
`custom_reward_function.reward_kwargs`. The returned `FileScorer` pickles as (path, name, kwargs),
so worker processes of the reward pool load the file themselves.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from typing import Any


class FileScorer:
    """`function_name` of the file at `path`, called with `bound_kwargs`; loaded once per process."""

    def __init__(self, path: Path, function_name: str, bound_kwargs: dict[str, Any]) -> None:
        self.path, self.function_name, self.bound_kwargs = path, function_name, bound_kwargs
        self._function = _load_function(path, function_name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._function(*args, **{**self.bound_kwargs, **kwargs})

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "function_name": self.function_name, "bound_kwargs": self.bound_kwargs}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["function_name"], state["bound_kwargs"])

    def __repr__(self) -> str:
        return f"FileScorer({self.path}:{self.function_name})"


def load_custom_scorer(path: str | Path, function_name: str, **bound_kwargs: Any) -> FileScorer:
    """Import `path` and return its `function_name`, with `bound_kwargs` applied.

    Errors name the path and the function: a missing file (FileNotFoundError), a file that fails
    to import (ImportError, chained to the original), a missing or non-callable attribute
    (AttributeError / TypeError listing the callables the file does define).
    """
    file = Path(path).expanduser().resolve()
    return FileScorer(file, function_name, dict(bound_kwargs))


def _load_function(file: Path, function_name: str) -> Any:
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
    return function
