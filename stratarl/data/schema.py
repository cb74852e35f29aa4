"""Layer 5, data: verl's parquet row schema — reading, checking and writing rows with pyarrow.

A row: `data_source` (str), `prompt` (list of chat messages {"role", "content"}), `ability` (str),
`reward_model` ({"style", "ground_truth"}), `extra_info` ({"split", "index", ...}), and optionally
`agent_name` (str: the agent loop of a multi-turn row, verl's per-row choice). Extra columns are
kept untouched. `check_row` turns one raw row into a `VerlRow` or raises `RowError` with a
reason, so a reader can report the file and row and move on; the reason's `problem` is the same for
every row with that problem, so a reader can count them instead of repeating it per row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

_NOTHING = object()


class RowError(ValueError):
    """One row does not follow the schema. `problem` says which field and why, worded the same for
    every row with that problem (what a reader groups by); the message adds the value found."""

    def __init__(self, problem: str, *, got: Any = _NOTHING):
        self.problem = problem
        self.found = "" if got is _NOTHING else _describe(got)
        super().__init__(f"{problem}, got {self.found}" if self.found else problem)


@dataclass(frozen=True)
class VerlRow:
    data_source: str
    messages: list[dict[str, Any]]  # chat messages, each with str "role" and "content"
    ground_truth: Any
    ability: str
    extra_info: dict[str, Any]
    agent_name: str | None = None  # None: agent.default_agent


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """All rows of one parquet file as Python dicts, in file order (row i is index i)."""
    try:
        return pq.read_table(path).to_pylist()
    except FileNotFoundError:
        raise
    except (pa.ArrowException, OSError) as err:
        raise ValueError(f"cannot read parquet file {path}: {err}") from err


def write_rows(path: str | Path, rows: Sequence[dict[str, Any]]) -> Path:
    """Write rows to one parquet file (schema inferred from the rows, which must agree)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(list(rows)), out)
    return out


def check_row(
    row: dict[str, Any], *, prompt_key: str = "prompt", data_source_key: str = "data_source"
) -> VerlRow:
    """The row as a `VerlRow`, or RowError naming the first field that breaks the schema.
    prompt_key / data_source_key: the columns holding the messages and the scorer's name (verl's
    data.prompt_key and data.reward_fn_key)."""
    ability = row.get("ability")
    if ability is not None and not isinstance(ability, str):
        raise RowError("ability must be a string", got=ability)
    extra_info = row.get("extra_info")
    if extra_info is not None and not isinstance(extra_info, dict):
        raise RowError("extra_info must be a dict", got=extra_info)
    agent_name = row.get("agent_name")
    if agent_name is not None and (not isinstance(agent_name, str) or not agent_name):
        raise RowError("agent_name must be a non-empty string or absent", got=agent_name)
    return VerlRow(
        data_source=_check_data_source(row, data_source_key),
        messages=_check_messages(row, prompt_key),
        ground_truth=_check_ground_truth(row),
        ability=ability or "",
        extra_info=dict(extra_info or {}),
        agent_name=agent_name,
    )


def _check_data_source(row: dict[str, Any], key: str) -> str:
    if key not in row:
        raise RowError(f"{key} column is missing")
    data_source = row[key]
    if data_source is None:
        raise RowError(f"{key} is missing (null)")
    if not isinstance(data_source, str):
        raise RowError(f"{key} must be a string (the reward function's name)", got=data_source)
    if not data_source:
        raise RowError(f"{key} is empty")
    return data_source


def _check_messages(row: dict[str, Any], key: str) -> list[dict[str, Any]]:
    if key not in row:
        raise RowError(f"{key} column is missing")
    prompt = row[key]
    if not isinstance(prompt, list | tuple):
        raise RowError(f"{key} must be a list of chat messages", got=prompt)
    if not prompt:
        raise RowError(f"{key} has no messages")
    messages = []
    for i, message in enumerate(prompt):
        if not isinstance(message, dict):
            raise RowError(f"{key}[{i}] must be a dict with role and content", got=message)
        for field in ("role", "content"):
            if not isinstance(message.get(field), str):
                raise RowError(f"{key}[{i}].{field} must be a string", got=message.get(field))
        # Parquet structs give every message every field seen in the column; drop the null fillers
        # so chat templates that test `'tool_calls' in message` see the original message.
        messages.append({name: value for name, value in message.items() if value is not None})
    return messages


def _check_ground_truth(row: dict[str, Any]) -> Any:
    if "reward_model" not in row:
        raise RowError("reward_model column is missing")
    reward_model = row["reward_model"]
    if not isinstance(reward_model, dict):
        raise RowError("reward_model must be a dict with ground_truth", got=reward_model)
    if reward_model.get("ground_truth") is None:
        raise RowError("reward_model.ground_truth is missing or null")
    return reward_model["ground_truth"]


def _describe(value: Any) -> str:
    if value is None:
        return "null (missing)"
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"
