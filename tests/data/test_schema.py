"""verl row schema: good rows pass as-is, each kind of malformed row is named by its field."""

import pytest

from stratarl.data.schema import RowError, check_row, read_rows, write_rows

GOOD = {
    "data_source": "openai/gsm8k",
    "prompt": [
        {"role": "system", "content": "be brief", "tool_calls": None},
        {"role": "user", "content": "1+1?"},
    ],
    "ability": "math",
    "reward_model": {"style": "rule", "ground_truth": "2"},
    "extra_info": {"split": "train", "index": 4},
}


def test_good_row_keeps_its_fields_and_drops_null_struct_fillers():
    row = check_row(GOOD)
    assert row.data_source == "openai/gsm8k" and row.ground_truth == "2" and row.ability == "math"
    assert row.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+1?"}]
    assert row.extra_info == {"split": "train", "index": 4}


def test_optional_fields_may_be_absent():
    row = check_row({k: v for k, v in GOOD.items() if k not in ("ability", "extra_info")})
    assert row.ability == "" and row.extra_info == {}


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"prompt": None}, "prompt must be a list"),
        ({"prompt": "1+1?"}, "prompt must be a list"),
        ({"prompt": []}, "no messages"),
        ({"prompt": [{"role": "user", "content": None}]}, r"prompt\[0\].content"),
        ({"prompt": [{"role": 3, "content": "x"}]}, r"prompt\[0\].role"),
        ({"prompt": ["hello"]}, r"prompt\[0\] must be a dict"),
        ({"reward_model": None}, "reward_model must be a dict"),
        ({"reward_model": {"style": "rule", "ground_truth": None}}, "ground_truth"),
        ({"data_source": None}, "data_source"),
        ({"extra_info": "x"}, "extra_info"),
    ],
)
def test_malformed_rows_name_the_field(change, reason):
    with pytest.raises(RowError, match=reason):
        check_row({**GOOD, **change})


def test_a_missing_data_source_reads_as_missing_and_the_problem_is_the_same_for_every_value():
    """Was: "data_source must be a non-empty string, got NoneType None"."""
    errors = {}
    for name, row in {
        "null": {**GOOD, "data_source": None},
        "absent": {k: v for k, v in GOOD.items() if k != "data_source"},
        "empty": {**GOOD, "data_source": ""},
        "int": {**GOOD, "data_source": 7},
        "other int": {**GOOD, "data_source": 8},
    }.items():
        with pytest.raises(RowError) as caught:
            check_row(row)
        errors[name] = caught.value
    assert str(errors["null"]) == "data_source is missing (null)"
    assert str(errors["absent"]) == "data_source column is missing"
    assert str(errors["empty"]) == "data_source is empty"
    assert str(errors["int"]) == "data_source must be a string (the reward function's name), got int 7"
    assert errors["int"].problem == errors["other int"].problem and errors["int"].found == "int 7"
    assert not any("NoneType" in str(e) for e in errors.values())


def test_missing_columns_are_malformed():
    with pytest.raises(RowError, match="prompt column is missing"):
        check_row({k: v for k, v in GOOD.items() if k != "prompt"})
    with pytest.raises(RowError, match="reward_model column is missing"):
        check_row({k: v for k, v in GOOD.items() if k != "reward_model"})


def test_write_read_round_trip(tmp_path):
    path = write_rows(tmp_path / "sub" / "x.parquet", [GOOD, GOOD])
    rows = read_rows(path)
    # Parquet gives every message of the column the union of fields (tool_calls: None on the user
    # message); check_row removes those fillers, so the checked rows equal the originals.
    assert rows[0]["prompt"][1] == {"role": "user", "content": "1+1?", "tool_calls": None}
    assert [check_row(r) for r in rows] == [check_row(GOOD)] * 2


def test_unreadable_file_names_the_path(tmp_path):
    bad = tmp_path / "not.parquet"
    bad.write_text("plain text")
    with pytest.raises(ValueError, match=r"not\.parquet"):
        read_rows(bad)
    with pytest.raises(FileNotFoundError):
        read_rows(tmp_path / "missing.parquet")
