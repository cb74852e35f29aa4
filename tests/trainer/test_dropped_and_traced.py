"""A run that loses most of its prompts to data.max_prompt_tokens says so (console, metrics.jsonl,
dropped_rows.jsonl), and its trace holds the numbers GRPO computed each advantage from and each
scorer failure's reason."""

import io
import json
import math
import re

import pytest
from rich.console import Console

from stratarl.data.schema import read_rows, write_rows
from stratarl.observe.run_log import read_metrics
from stratarl.observe.trace_answers import ten_answers
from stratarl.observe.trace_command import trace_command
from stratarl.observe.trace_store import read_step
from stratarl.trainer.rl_trainer import RLTrainer
from tests.trainer.test_rl_trainer import small_config

LONG = "Please think step by step about this question, then answer it. " * 4
LIMIT = 40  # the arithmetic prompts are about 23 tokens after the template; LONG ones are well over


def with_long_prompts(rows, every):
    """The rows with a long text put before the question of every row whose index % every != 0."""
    out = []
    for i, row in enumerate(rows):
        if i % every:
            message = dict(row["prompt"][0])
            message["content"] = LONG + message["content"]
            row = {**row, "prompt": [message]}
        out.append(row)
    return out


@pytest.fixture(scope="module")
def run(task, tmp_path_factory):
    root = tmp_path_factory.mktemp("dropped")
    train = with_long_prompts(read_rows(task["train"]), every=4)  # 64 rows: 48 long
    train[4] = {**train[4], "prompt": []}  # two short rows break the schema
    train[8] = {**train[8], "reward_model": None}
    val = with_long_prompts(read_rows(task["test"]), every=4)  # 8 rows: 6 long
    scorer = root / "flaky.py"
    scorer.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    if len(solution_str) % 2:\n"
        "        raise ValueError(f'planted: cannot read {len(solution_str)} characters')\n"
        "    return float(len(solution_str) % 3 == 0)\n"
    )
    cfg = small_config(
        task,
        f"data.train_files=[{write_rows(root / 'train.parquet', train)}]",
        f"data.val_files=[{write_rows(root / 'val.parquet', val)}]",
        f"data.max_prompt_tokens={LIMIT}",
        f"reward.custom_function_path={scorer}",
        "trainer.total_steps=1",
        "trainer.test_freq=0",
        "trainer.val_before_train=false",
    )
    out = io.StringIO()
    trainer = RLTrainer(cfg, root / "run", console=Console(file=out, width=250))
    trainer.fit()
    return root / "run", out.getvalue(), trainer


def test_the_start_of_the_run_says_how_many_prompts_were_dropped_and_why(run):
    run_dir, console, trainer = run
    longest = trainer.train_set.report.longest_prompt_tokens
    assert longest > LIMIT
    assert (
        f"train data: dropped 50 of 64 prompts: 48 over data.max_prompt_tokens={LIMIT} (longest {longest} "
        "tokens); 2 malformed (prompt has no messages: 1, reward_model must be a dict with ground_truth: 1)"
    ) in console
    val_longest = trainer.val_set.report.longest_prompt_tokens
    assert (
        f"val data: dropped 6 of 8 prompts over data.max_prompt_tokens={LIMIT} (longest {val_longest} tokens)"
    ) in console
    assert f"dropped rows and their reasons: {run_dir / 'dropped_rows.jsonl'}" in console.replace("\n", "")


def test_the_counts_are_in_metrics_jsonl_before_the_first_step_and_in_its_record(run):
    run_dir, _, trainer = run
    records = read_metrics(run_dir / "metrics.jsonl")
    first, step_1 = records[0], next(r for r in records if r["phase"] == "train")
    counts = {
        "data/prompts_dropped": 50.0,
        "data/prompts_dropped/too_long": 48.0,
        "data/prompts_dropped/malformed": 2.0,
        "data/prompts_kept": 14.0,
        "data/longest_prompt_tokens": float(trainer.train_set.report.longest_prompt_tokens),
        "data/prompts_unsampled": 0.0,
        "data/prompts_unused_per_epoch": 2.0,  # 14 prompts, batches of 4
        "data/val/prompts_dropped": 6.0,
        "data/val/prompts_dropped/too_long": 6.0,
        "data/val/prompts_dropped/malformed": 0.0,
        "data/val/prompts_kept": 2.0,
    }
    assert (first["step"], first["phase"]) == (0, "data")
    assert {k: first[k] for k in counts} == counts
    assert step_1["step"] == 1 and {k: step_1[k] for k in counts} == counts


def test_each_dropped_row_is_listed_with_its_reason(run):
    run_dir, _, _ = run
    rows = [json.loads(line) for line in (run_dir / "dropped_rows.jsonl").read_text().splitlines()]
    assert len(rows) == 50 + 6
    train = {r["row"]: r for r in rows if r["split"] == "train"}
    assert sorted(train) == sorted([i for i in range(64) if i % 4] + [4, 8])
    assert train[1]["reason"] == "too_long" and train[1]["data_source"] == "arithmetic"
    assert train[1]["prompt_tokens"] > LIMIT and f"> max_prompt_tokens={LIMIT}" in train[1]["detail"]
    assert (train[4]["reason"], train[4]["detail"], train[4]["prompt_tokens"]) == (
        "malformed", "prompt has no messages", None
    )  # fmt: skip
    assert train[8]["detail"].startswith("reward_model must be a dict with ground_truth")
    assert sorted(r["row"] for r in rows if r["split"] == "val") == [1, 2, 3, 5, 6, 7]


def test_the_trace_reproduces_each_advantage_from_the_statistics_it_shows(run):
    run_dir, _, _ = run
    rows = read_step(run_dir, 1)
    assert len(rows) == 16 and {r["estimator"] for r in rows} == {"grpo"}
    with_signal = [r for r in rows if r["group_has_signal"]]
    assert with_signal, "the planted scorer gives most groups some variance"
    for row in rows:
        recomputed = (row["advantage_score"] - row["advantage_baseline"]) / (
            row["advantage_std"] + row["advantage_eps"]
        )
        assert recomputed == pytest.approx(row["advantage"], rel=1e-5, abs=1e-6)
        group = [r["advantage_score"] for r in rows if r["uid"] == row["uid"]]
        mean = sum(group) / len(group)
        unbiased = math.sqrt(sum((s - mean) ** 2 for s in group) / (len(group) - 1))
        assert row["advantage_baseline"] == pytest.approx(mean, abs=1e-6)
        assert row["advantage_std"] == pytest.approx(unbiased, abs=1e-6) == row["group_reward_std"]
        assert (row["advantage_eps"], row["advantage_std_normalized"]) == (1e-6, True)
    # What the trace showed before (the population std) does not reproduce them.
    row = with_signal[0]
    population = row["advantage_std"] * math.sqrt((row["group_size"] - 1) / row["group_size"])
    wrong = (row["advantage_score"] - row["advantage_baseline"]) / (population + 1e-6)
    assert abs(wrong - row["advantage"]) > 1e-2
    answers = {a.question: dict(a.lines) for a in ten_answers(row)}
    assert answers["advantage"]["computed as"].startswith("(R − μ) / (σ + ε) = (")


def test_a_scorer_failure_reason_is_in_the_trace_row_and_its_view(run):
    run_dir, _, _ = run
    rows = read_step(run_dir, 1)
    failed = [r for r in rows if r["reward_failure"]]
    scored = [r for r in rows if not r["reward_failure"]]
    assert failed and scored
    for row in failed:
        message = row["reward_failure_message"]
        assert row["reward_failure"] == "ValueError" and re.fullmatch(
            r"planted: cannot read \d+ characters", message
        )
        answers = {a.question: dict(a.lines) for a in ten_answers(row)}
        assert answers["reward"]["scorer failed"] == f"ValueError: {message}"
    assert all(r["reward_failure_message"] == "" for r in scored)
    out = io.StringIO()
    console = Console(file=out, width=200)
    assert trace_command(run_dir, where="reward_failure == 'ValueError'", console=console) == 0
    view = out.getvalue()
    assert "scorer failed" in view and "planted: cannot read" in view and "(R − μ) / (σ + ε)" in view
