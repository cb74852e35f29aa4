"""Run directory, beside layer 2: the summary of a run — what ran, where it went, how it ended —
printed as a table at the end and written to summary.json, beside the run's other end products
(`finish_run`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stratarl.cluster.handles import CriticHandle, PolicyHandle
from stratarl.observe.plots import plot_learning_curves, plot_run
from stratarl.observe.run_log import RunLog, naming_the_file, write_atomically

# Written by `stratarl sft` beside the weights of final/: its summary (held-out accuracy before and
# after, steps), read when `stratarl train` starts from that model.
SFT_RESULT = "sft_result.json"

# Last-step metrics worth a line of their own; controller bytes are averaged over the run's steps.
LAST_STEP_METRICS = ("critic/score/mean", "actor/entropy")
TRAFFIC_METRICS = ("controller/sent_bytes", "controller/received_bytes")


def summary_rows(
    history: list[dict[str, Any]],
    last_val: Mapping[str, float],
    where: Mapping[str, str],
    start: int,
    total_steps: int,
    seconds: float,
) -> dict[str, Any]:
    """Rows of the run summary: steps run, wall time, `where` (paths), the last step's score and
    entropy, the mean bytes per step that passed through the controller, the failures of user code
    over the run (scorers; tools and interactions in agent runs), the last val-core metrics."""
    train = [record for record in history if record.get("phase") == "train"]
    rows: dict[str, Any] = {
        "steps": f"{start + 1}..{total_steps} this run (of {total_steps})"
        if start < total_steps
        else f"none: the checkpoint at step {start} is the end of the run",
        "wall time (s)": round(seconds, 1),
        **where,
    }
    if train:
        rows |= {k: v for k, v in train[-1].items() if k in LAST_STEP_METRICS}
        rows |= {f"{k} per step": sum(r.get(k, 0.0) for r in train) / len(train) for k in TRAFFIC_METRICS}
        rows["reward failures"] = failure_summary(train, "reward/failures/")
        if any(key.startswith("agent/") for key in train[-1]):
            rows["agent failures"] = failure_summary(train, "agent/failures/")
    rows |= {k: v for k, v in last_val.items() if k.startswith("val-core/")}
    return rows


def finish_run(
    log: RunLog,
    worker: PolicyHandle,
    tokenizer: Any,
    *,
    checkpoints: Path | None,
    last_val: Mapping[str, float],
    start: int,
    total_steps: int,
    seconds: float,
) -> None:
    """The end products of a finished run: final/ (HF weights and tokenizer), curves.png and plots/,
    and the run summary (printed, and summary.json)."""
    run_dir = log.run_dir
    with naming_the_file(run_dir / "final"):  # a full disk: its OSError names no file
        worker.save_pretrained(run_dir / "final")
        tokenizer.save_pretrained(run_dir / "final")
    curves = plot_learning_curves(log.history, run_dir / "curves.png")
    log.log_image("curves", curves, step=total_steps)
    plot_run(log.history, run_dir / "plots")
    rows = summary_rows(log.history, last_val, where(run_dir, checkpoints), start, total_steps, seconds)
    write_summary(log, rows, last_val)


def write_placement(run_dir: Path, worker: PolicyHandle, critic: CriticHandle | None) -> None:
    """placement.json: where each role's processes run (Ray node ids, rank order)."""
    placement = worker.placement() | (critic.placement() if critic is not None else {})
    (run_dir / "placement.json").write_text(json.dumps(placement, indent=2) + "\n")


def where(run_dir: Path, checkpoints: Path | None) -> dict[str, str]:
    """The summary's paths, absolute: the run, its final weights, its checkpoints (or none)."""
    return {
        "run directory": str(run_dir.absolute()),
        "final weights": str((run_dir / "final").absolute()),
        "checkpoints": str(checkpoints.absolute()) if checkpoints else "none",
    }


def write_summary(log: RunLog, rows: Mapping[str, Any], last_val: Mapping[str, float]) -> None:
    """Print `rows` as the run summary table; write them, with every metric of the last
    validation, to summary.json (atomically)."""
    log.print_table("run summary", rows)
    record = {**rows, "last_validation": dict(last_val)}
    write_atomically(log.run_dir / "summary.json", json.dumps(record, indent=2) + "\n")


def failure_summary(records: list[dict[str, Any]], prefix: str) -> str:
    """The run's failures of user code summed over its steps by reason, e.g. "SystemExit: 1, timeout: 3",
    or "none"; the per-data-source counts stay in metrics.jsonl."""
    totals: dict[str, float] = {}
    for record in records:
        for key, value in record.items():
            reason = key.removeprefix(prefix)
            if key.startswith(prefix) and "/" not in reason and reason != "total" and value:
                totals[reason] = totals.get(reason, 0.0) + value
    return ", ".join(f"{reason}: {int(count)}" for reason, count in sorted(totals.items())) or "none"


def read_sft_result(model_dir: str | Path) -> dict[str, Any] | None:
    """The SFT summary a model directory carries (`SFT_RESULT`), None when it has none or it is unreadable."""
    path = Path(model_dir) / SFT_RESULT
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return result if isinstance(result, dict) else None
