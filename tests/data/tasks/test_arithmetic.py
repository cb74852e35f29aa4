"""The arithmetic task: verl-schema parquet round trip, correct answers, disjoint seeded splits, CLI."""

import random

import pyarrow.parquet as pq
import pytest

from stratarl.data.schema import check_row
from stratarl.data.tasks.arithmetic import draw_expressions, evaluate, main, make_arithmetic_dataset


def _rows(path):
    return pq.read_table(path).to_pylist()


def test_parquet_round_trip_has_verl_schema_and_true_answers(tmp_path):
    paths = make_arithmetic_dataset(tmp_path, n_train=50, n_test=10, digits=(1, 3), operators="+-*", seed=1)
    assert set(paths) == {"train", "test"}
    for split, path in paths.items():
        rows = _rows(path)
        assert len(rows) == {"train": 50, "test": 10}[split]
        for index, row in enumerate(rows):
            verl_row = check_row(row)  # raises if the schema is broken
            assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
            assert row["data_source"] == "arithmetic" and row["reward_model"]["style"] == "rule"
            assert verl_row.messages == [{"role": "user", "content": row["extra_info"]["question"]}]
            info = row["extra_info"]
            assert (info["split"], info["index"]) == (split, index)
            # Python's own evaluator as the independent reference for the ground truth.
            truth = eval(info["expression"], {"__builtins__": {}})
            assert row["reward_model"]["ground_truth"] == str(truth)
            assert info["answer"] == f"Answer: {truth}"
            assert f"What is {info['expression']}?" in info["question"]


def test_splits_are_disjoint_and_seeded(tmp_path):
    a = make_arithmetic_dataset(tmp_path / "a", n_train=300, n_test=60, digits=2, seed=7)
    b = make_arithmetic_dataset(tmp_path / "b", n_train=300, n_test=60, digits=2, seed=7)
    c = make_arithmetic_dataset(tmp_path / "c", n_train=300, n_test=60, digits=2, seed=8)
    train = [r["extra_info"]["expression"] for r in _rows(a["train"])]
    test = [r["extra_info"]["expression"] for r in _rows(a["test"])]
    assert len(set(train)) == 300 and len(set(test)) == 60
    assert not set(train) & set(test)
    assert _rows(a["train"]) == _rows(b["train"]) and _rows(a["test"]) == _rows(b["test"])
    assert _rows(a["train"]) != _rows(c["train"])


def test_test_split_does_not_depend_on_n_train(tmp_path):
    small = make_arithmetic_dataset(tmp_path / "s", n_train=10, n_test=30, seed=2)
    large = make_arithmetic_dataset(tmp_path / "l", n_train=500, n_test=30, seed=2)
    assert _rows(small["test"]) == _rows(large["test"])


def test_digits_operators_operands_and_sign_are_respected():
    pairs = draw_expressions(400, digits=(2, 3), operators="-", num_operands=3, non_negative=True, seed=0)
    for expression, value in pairs:
        operands = expression.split("-")
        assert len(operands) == 3 and all(2 <= len(x) <= 3 and x[0] != "0" for x in operands)
        assert value >= 0 and value == eval(expression)


def test_evaluate_matches_python_precedence():
    rng = random.Random(0)
    for _ in range(500):
        k = rng.randint(2, 5)
        operands = [rng.randint(0, 99) for _ in range(k)]
        ops = [rng.choice("+-*") for _ in range(k - 1)]
        text = str(operands[0]) + "".join(f"{o}{x}" for o, x in zip(ops, operands[1:], strict=True))
        assert evaluate(operands, ops) == eval(text), text
    assert evaluate([2, 3, 4], ["+", "*"]) == 14  # 2 + (3*4)
    assert evaluate([2, 3, 4], ["-", "-"]) == -5  # (2-3)-4


def test_impossible_requests_fail_with_the_reason():
    # one-digit a+b: 10 * 10 = 100 distinct expressions at most
    with pytest.raises(ValueError, match="only 100 distinct"):
        draw_expressions(101, digits=(1, 1), operators="+", num_operands=2, non_negative=False, seed=0)
    assert (
        len(draw_expressions(100, digits=(1, 1), operators="+", num_operands=2, non_negative=False, seed=0))
        == 100
    )
    with pytest.raises(ValueError, match="operators"):
        draw_expressions(5, digits=(1, 1), operators="/", num_operands=2, non_negative=False, seed=0)


def test_cli_writes_both_splits_and_has_help(tmp_path, capsys):
    argv = [
        "--out",
        str(tmp_path),
        "--n-train",
        "20",
        "--n-test",
        "5",
        "--digits",
        "1",
        "2",
        "--operators",
        "+*",
    ]
    assert main(argv) == 0
    assert len(_rows(tmp_path / "train.parquet")) == 20 and len(_rows(tmp_path / "test.parquet")) == 5
    assert "*" in "".join(r["extra_info"]["expression"] for r in _rows(tmp_path / "train.parquet"))
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0 and "--n-train" in capsys.readouterr().out
