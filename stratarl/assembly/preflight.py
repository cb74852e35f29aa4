"""Assembly: input checks that need more than the config — run before any worker starts.

`validate_config` checks the settings themselves; these load what they point at and fail as one
`ConfigError` naming the key, the file and the rows: a dataset that cannot be read, a custom reward
file without the named function, rows whose `data_source` has no reward function (found here,
not at the step that first samples such a row), SFT rows without a reference answer, fewer
training rows than one step's prompts, a tool config whose tools cannot be built or sent to the
tool worker processes.
"""

from __future__ import annotations

import pickle
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import yaml

from stratarl.agent.tools.base import Tool
from stratarl.agent.tools.registry import load_tools
from stratarl.assembly import datasets, scoring
from stratarl.config import ConfigError, ConfigProblem, RunConfig
from stratarl.data.prompt_dataset import PromptDataset
from stratarl.reward.registry import SCORERS, default_compute_score

SHOWN_ROWS = 5  # rows listed per problem


def load_split(cfg: RunConfig, key: str, tokenizer: Any) -> PromptDataset:
    """The prompts of data.train_files, data.val_files or sft.train_files (`key`), with its
    data.max_*_prompts (data.max_train_prompts for both training keys); a file that cannot be read,
    or no usable row, is a ConfigError naming `key`."""
    d = cfg.data
    if key == "data.val_files":
        files, limit = d.val_files, d.max_val_prompts
    else:  # the training rows: the RL run's, or SFT's own (only the key's own setting is read)
        files = d.train_files if key == "data.train_files" else cfg.sft.train_files
        limit = d.max_train_prompts
    try:
        return datasets.load_prompts(
            files, tokenizer, max_prompt_tokens=d.max_prompt_tokens, limit=limit, **datasets.data_columns(cfg)
        )
    except (ValueError, OSError) as err:
        raise ConfigError([ConfigProblem((key,), str(err))]) from err


def check_prompts_per_step(cfg: RunConfig, dataset: PromptDataset) -> None:
    """One step samples data.prompts_per_step distinct training rows (without replacement): the
    training files, as loaded, must hold at least that many."""
    d = cfg.data
    if len(dataset) >= d.prompts_per_step:
        return
    limited = f", data.max_train_prompts={d.max_train_prompts}" if d.max_train_prompts != -1 else ""
    keys = ("data.prompts_per_step", "data.train_files") + (("data.max_train_prompts",) if limited else ())
    raise ConfigError(
        [
            ConfigProblem(
                keys,
                f"one step needs data.prompts_per_step={d.prompts_per_step} prompts, and "
                f"data.train_files ({', '.join(map(str, d.train_files))}) gives {len(dataset)} rows "
                f"(as loaded{limited}): lower data.prompts_per_step or add rows",
            )
        ]
    )


def tools(cfg: RunConfig) -> dict[str, Tool]:
    """The tools of agent.tool_config_path, each built, and picklable where they run in worker
    processes (agent.tools_in_process=false); a file that cannot be read or parsed, an unknown module
    or class, a constructor that raises or a tool that cannot be pickled is a ConfigError naming
    the file and the tool."""
    a = cfg.agent
    path = a.tool_config_path
    try:
        built = load_tools(path)
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(
            [ConfigProblem(("agent.tool_config_path",), f"cannot read {path}: {err}")]
        ) from None
    except (ValueError, TypeError, ImportError, AttributeError) as err:
        raise ConfigError([ConfigProblem(("agent.tool_config_path",), f"{path}: {err}")]) from None
    if a.tools_in_process:
        return built
    for name, tool in built.items():
        try:
            pickle.dumps(tool)
        except Exception as err:  # pickling raises TypeError, AttributeError, PicklingError, ...
            raise ConfigError(
                [
                    ConfigProblem(
                        ("agent.tool_config_path", "agent.tools_in_process"),
                        f"{path}: tool {name!r} ({type(tool).__module__}.{type(tool).__qualname__}) "
                        f"cannot be sent to the tool worker processes ({type(err).__name__}: {err}): "
                        "make it picklable, or run tools in the trainer's process "
                        "(agent.tools_in_process=true)",
                    )
                ]
            ) from None
    return built


def reward_function(cfg: RunConfig) -> Callable[..., Any]:
    """The run's scorer (`scoring.build_compute_score`); a custom file that cannot be imported or
    lacks reward.custom_function_name is a ConfigError naming those keys (and the file's functions)."""
    try:
        return scoring.build_compute_score(cfg)
    except (OSError, ImportError, AttributeError, TypeError) as err:
        keys = ("reward.custom_function_path", "reward.custom_function_name")
        raise ConfigError([ConfigProblem(keys, str(err))]) from err


def check_data_sources(compute_score: Callable[..., Any], splits: dict[str, PromptDataset | None]) -> None:
    """With the built-in registry (no custom scorer), every row's data_source must have a reward
    function; `splits` maps the config key of each split to its prompts."""
    if compute_score is not default_compute_score:
        return  # a custom scorer decides what it accepts
    problems = []
    for key, dataset in splits.items():
        if dataset is None:
            continue
        unknown = _rows_by_source(dataset.items, lambda item: item.data_source not in SCORERS)
        for source, rows in unknown.items():
            problems.append(
                ConfigProblem(
                    (key, "reward.custom_function_path"),
                    f"data_source {source!r} has no reward function ({_rows(rows)}); registered: "
                    f"{', '.join(sorted(SCORERS))}. Give a scorer file in reward.custom_function_path, "
                    "or register the source in stratarl.reward.registry.SCORERS",
                )
            )
    if problems:
        raise ConfigError(problems)


def check_teacher_sources(cfg: RunConfig, dataset: PromptDataset, key: str = "data.train_files") -> None:
    """With several teachers (distillation.teachers) and no default teacher
    (distillation.teacher_model_path empty), every training row's data_source needs a teacher."""
    d = cfg.distillation
    if not d.enabled or d.teacher_model_path or not d.teachers:
        return
    missing = _rows_by_source(dataset.items, lambda item: item.data_source not in d.teachers)
    problems = [
        ConfigProblem(
            (key, "distillation.teachers", "distillation.teacher_model_path"),
            f"data_source {source!r} has no teacher ({_rows(rows)}); teachers: "
            f"{', '.join(sorted(d.teachers))}. Add it to distillation.teachers, or give a default "
            "teacher in distillation.teacher_model_path",
        )
        for source, rows in missing.items()
    ]
    if problems:
        raise ConfigError(problems)


def check_sft_answers(dataset: PromptDataset, key: str = "data.train_files") -> None:
    """SFT trains on extra_info['answer'] (verl's SFT convention): every row of `key`'s files (the
    one SFT trains on, `sft_train_key`) needs a non-empty one."""
    missing = _rows_by_source(dataset.items, lambda item: not _has_answer(item))
    if missing:
        problems = [
            ConfigProblem(
                (key,),
                f"SFT needs extra_info['answer'] (the reference response): {_rows(rows)}",
            )
            for rows in missing.values()
        ]
        raise ConfigError(problems)


def check_sft_lengths(
    dataset: PromptDataset, tokenizer: Any, max_tokens: int, key: str = "data.train_files"
) -> None:
    """Every SFT example (prompt ++ reference answer ++ EOS) fits `sft.max_tokens` (verl's
    data.max_length with truncation=error): a longer one is refused with its rows, never cut."""
    lengths: dict[tuple[str, int], int] = {}
    for item in dataset.items:
        answer = tokenizer.encode(item.extra_info["answer"], add_special_tokens=False)
        lengths[(item.source_file, item.source_row)] = len(item.prompt_ids) + len(answer) + 1
    too_long = sorted(row for row, length in lengths.items() if length > max_tokens)
    if too_long:
        longest = max(lengths.values())
        raise ConfigError(
            [
                ConfigProblem(
                    ("sft.max_tokens",),
                    f"{max_tokens} tokens is shorter than {_rows(too_long)} of {key} "
                    f"(prompt + answer + EOS; the longest is {longest} tokens): raise sft.max_tokens "
                    "or drop those rows",
                )
            ]
        )


def sft_train_key(cfg: RunConfig) -> str:
    """The key of the files SFT trains on: sft.train_files, or data.train_files when it is empty."""
    return "sft.train_files" if cfg.sft.train_files else "data.train_files"


def _has_answer(item: Any) -> bool:
    answer = (item.extra_info or {}).get("answer")
    return isinstance(answer, str) and bool(answer)


def _rows_by_source(items: Iterable[Any], bad: Callable[[Any], bool]) -> dict[str, list[tuple[str, int]]]:
    found: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for item in items:
        if bad(item):
            found[item.data_source].append((item.source_file, item.source_row))
    return dict(found)


def _rows(rows: list[tuple[str, int]]) -> str:
    shown = ", ".join(f"{file} row {row}" for file, row in rows[:SHOWN_ROWS])
    more = f" and {len(rows) - SHOWN_ROWS} more" if len(rows) > SHOWN_ROWS else ""
    return f"{len(rows)} row{'s' if len(rows) != 1 else ''}: {shown}{more}"
