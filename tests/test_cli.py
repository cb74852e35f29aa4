"""The command line: every subcommand has --help, explain-field prints contracts, data make writes parquet."""

import pytest

from stratarl.cli import main


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["quickstart"],
        ["train"],
        ["sft"],
        ["data", "make", "arithmetic"],
        ["data", "make", "tool_arithmetic"],
        ["model", "import-gguf"],
    ],
)
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: stratarl" in capsys.readouterr().out


def test_explain_field_prints_the_contract_and_rejects_unknown_names(capsys):
    assert main(["explain-field", "response_mask"]) == 0
    out = capsys.readouterr().out
    assert "[N, T]" in out and "rollout" in out
    assert main(["explain-field", "respons_mask"]) == 2
    assert "response_mask" in capsys.readouterr().out  # the declared names are listed


def test_data_make_arithmetic_writes_train_and_test(tmp_path):
    assert (
        main(["data", "make", "arithmetic", "--out", str(tmp_path), "--n-train", "20", "--n-test", "5"]) == 0
    )
    assert (tmp_path / "train.parquet").exists() and (tmp_path / "test.parquet").exists()


def test_data_make_tool_arithmetic_writes_parquet_and_tools(tmp_path):
    assert (
        main(["data", "make", "tool_arithmetic", "--out", str(tmp_path), "--n-train", "8", "--n-test", "4"])
        == 0
    )
    assert {"train.parquet", "test.parquet", "tools.yaml"} <= {p.name for p in tmp_path.iterdir()}
