"""Cross-cutting: reading a run directory back — for `stratarl trace`, `doctor` and `plot`, also while
the run is still writing it.

A run directory holds metrics.jsonl (a line per step and validation), config.yaml (the resolved
config), traces/ (per-trajectory parquet), hang/ (watchdog and worker-failure reports). The quickstart
writes its RL run under <dir>/grpo; `resolve_run_dir` finds it from the quickstart's own directory.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from stratarl.observe.stack_dumps import HANG_DIR
from stratarl.observe.trace_store import TRACE_DIR

RL_SUBDIRS = ("grpo",)  # where the quickstart puts its RL run


def is_run_dir(path: Path) -> bool:
    """A directory a trainer wrote: its config, metrics, traces or hang reports."""
    markers = ("config.yaml", "metrics.jsonl", TRACE_DIR, HANG_DIR)
    return any((path / marker).exists() for marker in markers)


def resolve_run_dir(path: str | Path) -> Path:
    """`path` when it is a run directory, else its RL run (the quickstart's <dir>/grpo); raises
    FileNotFoundError saying what was looked for."""
    path = Path(path)
    if is_run_dir(path):
        return path
    for sub in RL_SUBDIRS:
        if is_run_dir(path / sub):
            return path / sub
    raise FileNotFoundError(
        f"{path} is not a run directory: no config.yaml, metrics.jsonl, {TRACE_DIR}/ or {HANG_DIR}/ in it"
        + (
            f" (nor in {', '.join(str(path / s) for s in RL_SUBDIRS)})"
            if path.is_dir()
            else " (it does not exist)"
        )
    )


def read_metrics_tolerant(path: str | Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl that may be mid-write: a last line without its newline, or one
    that does not parse, is left for the next read."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    lines = path.read_text(encoding="utf-8").split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:  # the line being written
                break
            raise ValueError(f"{path}: line {i + 1} is not JSON: {line[:120]!r}") from None
    return records


def read_config(run_dir: str | Path) -> dict[str, Any]:
    """The run's resolved config as a plain dict ({} when config.yaml is missing)."""
    path = Path(run_dir) / "config.yaml"
    if not path.exists():
        return {}
    return yaml.safe_load(path.read_text(encoding="utf-8")) or {}


def config_value(config: dict[str, Any], key: str) -> Any:
    """The value at dotted `key` of a config dict, None where absent (an older run's config)."""
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def read_hang_reports(run_dir: str | Path) -> list[dict[str, Any]]:
    """The watchdog's and the worker groups' failure reports (hang/*/report.json), oldest first."""
    root = Path(run_dir) / HANG_DIR
    if not root.is_dir():
        return []
    reports = []
    for path in sorted(root.glob("*/report.json"), key=lambda p: p.stat().st_mtime):
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            continue  # being written
        reports.append(report | {"folder": str(path.parent)})
    return reports


def train_records(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("phase") == "train"]


def load_run_tokenizer(run_dir: str | Path) -> Any:
    """The run's tokenizer (its final/ export, else the config's tokenizer or model path); None when
    none loads — views then show token ids."""
    from transformers import AutoTokenizer

    config = read_config(run_dir)
    candidates = [Path(run_dir) / "final"]
    for key in ("model.tokenizer_path", "model.path"):
        value = config_value(config, key)
        if value:
            candidates.append(Path(value))
    for candidate in candidates:
        if (candidate / "tokenizer.json").exists() or (candidate / "tokenizer_config.json").exists():
            try:
                return AutoTokenizer.from_pretrained(str(candidate))
            except (OSError, ValueError):
                continue
    return None
