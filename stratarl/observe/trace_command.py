"""Cross-cutting: what `stratarl trace RUN` does — pick a step and a trajectory of a run's trace,
print its ten answers (or write them as one HTML page), or follow one field through the phases."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from stratarl.observe.field_follow import follow_field, trace_columns_for
from stratarl.observe.run_records import config_value, load_run_tokenizer, read_config, resolve_run_dir
from stratarl.observe.trace_answers import select_row
from stratarl.observe.trace_html import write_trace_page
from stratarl.observe.trace_store import read_step, read_steps, step_files
from stratarl.observe.trace_view import render_trace


def trace_command(
    run: str | Path,
    *,
    step: int | None = None,
    uid: str | None = None,
    sample: int | None = None,
    worst: bool = False,
    best: bool = False,
    where: str | None = None,
    html: str | None = None,
    field: str | None = None,
    console: Console | None = None,
) -> int:
    """Exit code 0, or 2 with a message naming what was not found."""
    console = console or Console()
    try:
        run_dir = resolve_run_dir(run)
        if field is not None:
            config = read_config(run_dir)
            n = (config_value(config, "data.prompts_per_step") or 0) * (
                config_value(config, "rollout.n") or 0
            )
            traces = read_steps(run_dir, trace_columns_for(field))
            report = follow_field(
                field,
                traces,
                rows_per_step=n or None,
                response_tokens=config_value(config, "rollout.max_response_tokens"),
            )
            print(report)  # plain text: no wrapping at the terminal width
            return 0
        files = step_files(run_dir)
        if not files:
            raise LookupError(
                f"{run_dir} has no trace (traces/ is empty: trace.enable was false, or no step ran)"
            )
        chosen_step = max(files) if step is None else step
        row = select_row(
            read_step(run_dir, chosen_step), uid=uid, sample=sample, worst=worst, best=best, where=where
        )
    except (FileNotFoundError, KeyError, LookupError, ValueError) as error:
        console.print(f"[red]stratarl trace:[/red] {error.args[0] if error.args else error}", highlight=False)
        return 2
    tokenizer = load_run_tokenizer(run_dir)
    if html is not None:
        path = write_trace_page(row, tokenizer, html)
        console.print(f"wrote {path} (trajectory {row['trajectory_id']}, step {chosen_step})")
        return 0
    render_trace(row, tokenizer, console)
    return 0
