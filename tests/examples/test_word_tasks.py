"""The three word tasks of docs/own_task.md#three-more-tasks: make_data writes distinct verl-schema
rows whose reference answers are right, and each reward scores them 1 and a wrong or malformed reply 0."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[2]
TASKS = ["first_letter", "first_alphabetical", "reverse_words"]


def load_reward(task: str):
    spec = importlib.util.spec_from_file_location(f"{task}_reward", ROOT / "examples" / task / "reward.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.compute_score


@pytest.fixture(scope="module", params=TASKS)
def task_rows(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param)
    script = ROOT / "examples" / request.param / "make_data.py"
    cmd = [sys.executable, str(script), "--out", str(out), "--n-train", "300", "--n-test", "20"]
    subprocess.run(cmd, check=True, capture_output=True)
    splits = {split: pq.read_table(out / f"{split}.parquet").to_pylist() for split in ("train", "test")}
    return request.param, splits


def question(row: dict) -> str:
    return row["prompt"][0]["content"]


def words_of(text: str) -> list[str]:
    """The words between the task's colon and its closing '?' or '.'."""
    listed = text.split(": ", 1)[1].split("? Reply")[0].split(". Reply")[0]
    return listed.replace(",", "").split()


def test_make_data_writes_distinct_verl_rows(task_rows):
    task, splits = task_rows
    assert {split: len(rows) for split, rows in splits.items()} == {"train": 300, "test": 20}
    for split, rows in splits.items():
        for i, row in enumerate(rows):
            assert row["data_source"] == task and row["prompt"][0]["role"] == "user"
            truth = row["reward_model"]["ground_truth"]
            assert row["reward_model"] == {"style": "rule", "ground_truth": truth}
            assert row["extra_info"] == {"split": split, "index": i, "answer": f"Answer: {truth}"}
    train, test = ({question(r) for r in rows} for rows in (splits["train"], splits["test"]))
    assert len(train) == 300 and len(test) == 20 and not train & test


def test_the_ground_truth_is_the_right_answer(task_rows):
    task, splits = task_rows
    for row in splits["train"] + splits["test"]:
        words, truth = words_of(question(row)), row["reward_model"]["ground_truth"]
        if task == "first_letter":
            letter = question(row).split("'")[1]
            assert [w for w in words if w[0] == letter] == [truth]
        elif task == "first_alphabetical":
            assert len(set(words)) == len(words) and truth == sorted(words)[0]
        else:
            assert truth == " ".join(w[::-1] for w in words)


def test_the_reward_scores_reference_answers_1_and_wrong_or_malformed_replies_0(task_rows):
    task, splits = task_rows
    compute_score = load_reward(task)
    for row in splits["test"]:
        truth = row["reward_model"]["ground_truth"]
        assert compute_score(task, row["extra_info"]["answer"], truth)["score"] == 1.0
        wrong = next(w for w in words_of(question(row)) if w != truth)  # another word of the prompt
        for reply in (f"Answer: {wrong}", truth, f"Answer: {truth}.", f"The answer: {truth}", ""):
            assert compute_score(task, reply, truth)["score"] == 0.0, reply
    assert compute_score(task, "Answer: x", "y")["format_ok"] == 1.0
    assert compute_score(task, "no answer", "y")["format_ok"] == 0.0
