"""Layer 5, agent gateway: the user's agent program — an async function loaded from a file.

    async def run_episode(base_url: str, api_key: str, row: dict) -> float | dict | None

It talks to the policy through the OpenAI API at `base_url` with `api_key` (any client: `openai`,
`httpx`, a framework), with its own control flow, and returns the episode's reward: a number, a
dict with a numeric "score" (other keys are kept as reward extras), or None to have the run's
configured reward score the last assistant message it received. `row` is the dataset row
(`messages`, `data_source`, `ground_truth`, `extra_info`, ...). The trainer runs it in agent
worker processes (`agent_pool`), many episodes on each worker's event loop: code that blocks the
loop stalls that worker's other episodes until the pool kills it.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

AgentFunction = Callable[[str, str, dict], Awaitable[Any]]


class AgentProgramError(ValueError):
    """The agent file or function cannot be used; the message names the key and the file."""


def load_agent_function(path: str, name: str) -> AgentFunction:
    """`name` from the Python file `path`: an `async def` taking (base_url, api_key, row)."""
    file = Path(path)
    if not file.is_file():
        raise AgentProgramError(f"agent.gateway.agent_function_path: file not found: {path}")
    spec = importlib.util.spec_from_file_location(f"stratarl_agent_program_{file.stem}", file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and pickling inside the file look themselves up
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        raise AgentProgramError(
            f"agent.gateway.agent_function_path: {path} failed to import: {type(err).__name__}: {err}"
        ) from err
    function = getattr(module, name, None)
    if function is None:
        raise AgentProgramError(f"agent.gateway.agent_function_name: {path} defines no {name!r}")
    if not inspect.iscoroutinefunction(function):
        raise AgentProgramError(
            f"agent.gateway.agent_function_name: {name!r} in {path} must be an `async def` "
            "(base_url, api_key, row)"
        )
    try:
        inspect.signature(function).bind("url", "key", {})
    except TypeError as err:
        raise AgentProgramError(
            f"agent.gateway.agent_function_name: {name!r} in {path} cannot be called with "
            f"(base_url, api_key, row): {err}"
        ) from err
    return function


def read_reward(value: Any) -> tuple[float | None, dict[str, Any]]:
    """(reward or None, extras) from what the agent returned; ValueError if it is none of the forms."""
    if value is None:
        return None, {}
    if isinstance(value, dict):
        if "score" not in value:
            raise ValueError(f"the agent returned a dict without 'score': keys {sorted(value)[:8]}")
        extras = {k: v for k, v in value.items() if k != "score"}
        return _number(value["score"]), extras
    return _number(value), {}


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"the agent's reward must be a finite number, got {value!r}")
    return float(value)
