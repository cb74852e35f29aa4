"""Layer 5, data: prompts from verl-schema parquet files, chat-templated and tokenized once.

Each kept row becomes a `PromptItem` that carries its prompt token ids and everything a trace
needs to find it again (file, split, row index). Rows that break the schema or whose template
fails are skipped (`malformed`) and reported one line per problem, with the number of rows it
affects and the first few of them; prompts longer than `max_prompt_tokens` are dropped (`too_long`;
verl keeps length <= max_prompt_length). Every row left out is a `DroppedRow` with its reason, and
the report's `metrics()` and `start_line()` count them: nothing is discarded silently, and nothing
here crashes on one bad row.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stratarl.data.schema import RowError, check_row, read_rows

logger = logging.getLogger(__name__)
MAX_PROBLEM_LINES = 10  # distinct problems listed; the rest are counted
DROP_REASONS = ("too_long", "malformed")  # why a row is left out: over max_prompt_tokens, off-schema


@dataclass(frozen=True)
class PromptItem:
    """One prompt, ready to batch. `prompt_ids` are the chat-templated tokens, generation prompt included."""

    prompt_ids: list[int]
    messages: list[dict[str, Any]]
    data_source: str
    ground_truth: Any
    ability: str
    extra_info: dict[str, Any]
    source_file: str
    source_split: str  # extra_info["split"] when present, else the file's stem
    source_row: int  # row index inside source_file
    agent_name: str | None = None  # the row's agent loop (multi-turn); None: agent.default_agent


@dataclass
class RowProblem:
    """One problem of malformed rows (`RowError.problem`): how many rows have it, the first few."""

    reason: str
    count: int = 0
    rows: list[tuple[str, int]] = field(default_factory=list)  # (file, row index), the first few
    first_value: str = ""  # the value found in its first row, where the problem is a wrong value

    def __str__(self) -> str:
        by_file: dict[str, list[int]] = {}
        for file, row in self.rows:
            by_file.setdefault(file, []).append(row)
        where = "; ".join(
            f"{file} row{'s' if len(rows) > 1 else ''} {', '.join(map(str, rows))}"
            for file, rows in by_file.items()
        )
        more = ", …" if self.count > len(self.rows) else ""
        value = f"; first value: {self.first_value}" if self.first_value else ""
        return f"{self.reason}: {self.count} row{'s' if self.count != 1 else ''} ({where}{more}{value})"


@dataclass(frozen=True)
class DroppedRow:
    """One row that loading left out: where it is, why (`DROP_REASONS`), and what it measured."""

    file: str
    row: int  # row index inside `file`
    reason: str  # too_long | malformed
    detail: str  # the length against the limit, or the schema problem with the value found
    data_source: str | None  # None when the row has no usable data_source
    prompt_tokens: int | None  # after the chat template; None when the row never got that far

    def record(self, split: str) -> dict[str, Any]:
        """One line of the run's dropped_rows.jsonl (`split`: train or val)."""
        return {"split": split, **dataclasses.asdict(self)}


@dataclass
class DatasetReport:
    """What loading did: rows read, kept, dropped as over-long, skipped as malformed — one
    `RowProblem` per problem, its rows counted and the first `rows_shown` listed — and every row
    left out as a `DroppedRow`."""

    files: list[str]
    max_prompt_tokens: int
    num_rows: int = 0
    num_kept: int = 0
    num_overlong: int = 0
    num_malformed: int = 0
    longest_kept_tokens: int = 0
    longest_prompt_tokens: int = 0  # of every templated prompt, dropped ones included
    problems: dict[str, RowProblem] = field(default_factory=dict)  # by reason, in order of first row
    dropped: list[DroppedRow] = field(default_factory=list)  # in file and row order
    rows_shown: int = 5

    def add_problem(self, file: str, row: int, error: RowError, data_source: str | None = None) -> None:
        self.num_malformed += 1
        problem = self.problems.setdefault(error.problem, RowProblem(error.problem, first_value=error.found))
        problem.count += 1
        if len(problem.rows) < self.rows_shown:
            problem.rows.append((file, row))
        self.dropped.append(DroppedRow(file, row, "malformed", str(error), data_source, None))

    def add_overlong(self, file: str, row: int, item: PromptItem) -> None:
        self.num_overlong += 1
        tokens = len(item.prompt_ids)
        detail = f"{tokens} prompt tokens > max_prompt_tokens={self.max_prompt_tokens}"
        self.dropped.append(DroppedRow(file, row, "too_long", detail, item.data_source, tokens))

    @property
    def num_dropped(self) -> int:
        return self.num_overlong + self.num_malformed

    def dropped_by_reason(self) -> dict[str, int]:
        return {"too_long": self.num_overlong, "malformed": self.num_malformed}

    def metrics(self, prefix: str = "data") -> dict[str, float]:
        """`<prefix>/prompts_dropped` (all reasons), `<prefix>/prompts_dropped/<reason>` for every
        reason (0 included), `<prefix>/prompts_kept` and `<prefix>/longest_prompt_tokens` (dropped
        prompts included: the number to compare with max_prompt_tokens)."""
        out = {
            f"{prefix}/prompts_dropped": float(self.num_dropped),
            f"{prefix}/prompts_kept": float(self.num_kept),
            f"{prefix}/longest_prompt_tokens": float(self.longest_prompt_tokens),
        }
        return out | {f"{prefix}/prompts_dropped/{r}": float(n) for r, n in self.dropped_by_reason().items()}

    def start_line(self, what: str = "prompts", limit_key: str = "data.max_prompt_tokens") -> str:
        """One line for the start of a run, e.g. "dropped 1,500 of 2,000 prompts over
        data.max_prompt_tokens=64 (longest 211 tokens)", with "; 3 malformed (prompt has no
        messages: 3)" when rows broke the schema; `limit_key` names the setting of the limit."""
        longest = f"longest {self.longest_prompt_tokens:,} tokens"
        limit = f"{limit_key}={self.max_prompt_tokens:,}"
        if not self.num_dropped:
            return f"kept all {self.num_kept:,} {what} ({longest}, {limit})"
        parts = [f"{self.num_overlong:,} over {limit} ({longest})"] if self.num_overlong else []
        if self.num_malformed:
            shown = list(self.problems.values())[:3]
            reasons = ", ".join(f"{p.reason}: {p.count:,}" for p in shown)
            more = ", …" if len(self.problems) > len(shown) else ""
            parts.append(f"{self.num_malformed:,} malformed ({reasons}{more})")
        head = f"dropped {self.num_dropped:,} of {self.num_rows:,} {what}"
        if not self.num_malformed:  # the common case reads as one phrase
            return f"{head} over {limit} ({longest})"
        return f"{head}: " + "; ".join(parts) + ("" if self.num_overlong else f" ({longest})")

    def summary(self) -> str:
        lines = [
            f"{self.num_rows} rows from {len(self.files)} file(s): kept {self.num_kept}, "
            f"over {self.max_prompt_tokens} prompt tokens {self.num_overlong}, "
            f"malformed {self.num_malformed}; "
            f"longest kept prompt {self.longest_kept_tokens} tokens"
        ]
        problems = list(self.problems.values())
        lines += [f"  malformed: {problem}" for problem in problems[:MAX_PROBLEM_LINES]]
        if len(problems) > MAX_PROBLEM_LINES:
            rest = problems[MAX_PROBLEM_LINES:]
            lines.append(
                f"  ... and {len(rest)} more problems in {sum(p.count for p in rest)} more malformed rows"
            )
        return "\n".join(lines)


class PromptDataset:
    """A list of `PromptItem`s and the `DatasetReport` of how they were loaded."""

    def __init__(self, items: list[PromptItem], report: DatasetReport):
        self.items = items
        self.report = report

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> PromptItem:
        return self.items[index]

    def metrics(self, prefix: str = "data") -> dict[str, float]:
        """The report's counts (`DatasetReport.metrics`), and `<prefix>/prompts_unsampled`: rows that
        passed the filters but are not in this dataset (a seeded subsample, data.max_*_prompts)."""
        unsampled = float(self.report.num_kept - len(self.items))
        return self.report.metrics(prefix) | {f"{prefix}/prompts_unsampled": unsampled}


def tokenize_prompt(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    """Chat template applied once, tokenized in the same call: no second BOS, no double template.

    `return_dict=False` because transformers 5.x returns a BatchEncoding by default.
    """
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return [int(token) for token in ids]


def load_prompt_dataset(
    paths: str | Path | Sequence[str | Path],
    tokenizer: Any,
    *,
    max_prompt_tokens: int,
    max_problems: int = 5,
    prompt_key: str = "prompt",
    data_source_key: str = "data_source",
    filter_overlong: bool = True,
) -> PromptDataset:
    """Read verl-schema parquet file(s) as-is into a `PromptDataset`; log and attach the report.

    max_problems: rows listed per problem of malformed rows (all are counted).
    prompt_key / data_source_key name the message and scorer columns. A prompt over
    `max_prompt_tokens` is dropped and counted, or (filter_overlong=False) a ValueError naming its
    file, row and length.

    Raises FileNotFoundError / ValueError for a missing or unreadable file, and ValueError when
    no row survives (an empty dataset would otherwise train zero steps without saying why): the
    report is then in the error, and only there (it was printed twice, logged and raised).
    """
    files = [str(p) for p in ([paths] if isinstance(paths, str | Path) else paths)]
    report = DatasetReport(files=files, max_prompt_tokens=max_prompt_tokens, rows_shown=max_problems)
    items: list[PromptItem] = []
    for file in files:
        for row_index, row in enumerate(read_rows(file)):
            report.num_rows += 1
            try:
                item = _item_from_row(row, tokenizer, file, row_index, prompt_key, data_source_key)
            except RowError as err:
                source = row.get(data_source_key)
                report.add_problem(file, row_index, err, source if isinstance(source, str) else None)
                continue
            report.longest_prompt_tokens = max(report.longest_prompt_tokens, len(item.prompt_ids))
            if len(item.prompt_ids) > max_prompt_tokens:
                if not filter_overlong:
                    raise ValueError(
                        f"{file} row {row_index}: the prompt has {len(item.prompt_ids)} tokens after the "
                        f"chat template, over data.max_prompt_tokens={max_prompt_tokens} (with "
                        "data.filter_overlong=false an over-long prompt is an error; true drops it)"
                    )
                report.add_overlong(file, row_index, item)
                continue
            report.longest_kept_tokens = max(report.longest_kept_tokens, len(item.prompt_ids))
            items.append(item)
    report.num_kept = len(items)
    if not items:
        raise ValueError(f"no usable prompts in {', '.join(files)}:\n{report.summary()}")
    (logger.warning if report.num_malformed else logger.info)("prompt dataset: %s", report.summary())
    return PromptDataset(items, report)


def _item_from_row(
    row: dict[str, Any], tokenizer: Any, file: str, row_index: int, prompt_key: str, data_source_key: str
) -> PromptItem:
    verl_row = check_row(row, prompt_key=prompt_key, data_source_key=data_source_key)
    try:
        prompt_ids = tokenize_prompt(tokenizer, verl_row.messages)
    except Exception as err:  # a template may reject a role or a message layout
        raise RowError(f"chat template failed: {type(err).__name__}: {err}") from err
    if not prompt_ids:
        raise RowError("chat template produced no tokens")
    split = verl_row.extra_info.get("split")
    return PromptItem(
        prompt_ids=prompt_ids,
        messages=verl_row.messages,
        data_source=verl_row.data_source,
        ground_truth=verl_row.ground_truth,
        ability=verl_row.ability,
        extra_info=verl_row.extra_info,
        source_file=file,
        source_split=split if isinstance(split, str) and split else Path(file).stem,
        source_row=row_index,
        agent_name=verl_row.agent_name,
    )
