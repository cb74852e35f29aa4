"""The command line: every subcommand has --help, explain-field prints contracts, data make writes parquet;
config and input errors are one message with exit code 2; sft and train share output_root and summaries."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stratarl.cli import main
from stratarl.config import ConfigError

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["quickstart"],
        ["train"],
        ["verl"],
        ["sft"],
        ["init"],
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


@pytest.fixture(scope="module")
def tiny_task(tmp_path_factory):
    """An arithmetic task and a 1M model, for commands that train."""
    from stratarl.data.tasks.arithmetic import make_arithmetic_dataset
    from stratarl.data.tiny_models import build_tiny_model
    from stratarl.data.tokenizer_factory import corpus_from_parquet

    root = tmp_path_factory.mktemp("cli-task")
    paths = make_arithmetic_dataset(root / "data", n_train=32, n_test=8, digits=1, seed=0)
    model = build_tiny_model(
        root / "model", size="1m", corpus_texts=corpus_from_parquet([paths["train"]]), seed=0
    )
    return {"train": paths["train"], "test": paths["test"], "model": model}


def small_run(task, output_root, *extra):
    return [
        str(RECIPES / "quickstart.yaml"),
        f"data.train_files=[{task['train']}]",
        f"data.val_files=[{task['test']}]",
        f"model.path={task['model']}",
        f"trainer.output_root={output_root}",
        "data.prompts_per_step=4",
        "rollout.n=2",
        "rollout.max_response_tokens=6",
        "actor.prompts_per_mini_batch=4",
        "actor.trajectories_per_micro_batch=8",
        "trainer.total_steps=1",
        "trainer.test_freq=0",
        "trainer.val_before_train=false",
        "sft.total_steps=2",
        "sft.trajectories_per_step=8",
        "sft.trajectories_per_micro_batch=8",
        *extra,
    ]


def test_a_config_error_is_one_message_and_exit_code_2(capsys):
    """Was: every ConfigError came under a 15-line traceback."""
    assert main(["train", str(RECIPES / "quickstart.yaml"), "rollout.nn=4", "actor.lr=fast"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stratarl train: invalid config (2 problems):")
    assert "rollout.nn: unknown key; did you mean 'rollout.n'?" in err and "actor.lr: expected float" in err
    assert "Traceback" not in err and len(err.splitlines()) == 3
    with pytest.raises(ConfigError):  # --debug: the traceback, before or after the subcommand
        main(["train", str(RECIPES / "quickstart.yaml"), "rollout.nn=4", "--debug"])
    with pytest.raises(ConfigError):
        main(["--debug", "sft", str(RECIPES / "quickstart.yaml"), "rollout.nn=4"])


@pytest.mark.parametrize("command", ["train", "sft"])
@pytest.mark.parametrize(
    "overrides",
    [
        ("actor.lrr=1",),  # a typo in a key
        ("algorithm.adv_estimator=grpoo", "actor.kl_loss_type=k9"),  # unknown names in the registries
        ("model.path=/nonexistent/model",),  # a path that does not exist
    ],
    ids=["key", "names", "path"],
)
def test_a_config_error_is_reported_before_torch_or_transformers_is_imported(command, overrides):
    """Was: `stratarl train` imported the trainer (torch, transformers) first: 14 s on a busy CPU."""
    code = (
        "import sys\n"
        "from stratarl.cli import main\n"
        f"code = main({[command, str(RECIPES / 'quickstart.yaml'), *overrides]!r})\n"
        "print(code, sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split("\n")[-2] == "2 []", out.stdout + out.stderr
    assert f"stratarl {command}: invalid config" in out.stderr and "Traceback" not in out.stderr


def test_sft_and_train_share_output_root_and_write_summary_json(tiny_task, tmp_path, monkeypatch):
    """Was: `stratarl sft` ignored trainer.output_root and wrote runs/sft-<name>-<time>/ under the
    current directory, and only the quickstart wrote summary.json."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    assert main(["sft", *small_run(tiny_task, "out")]) == 0
    sft_dir = out / "stratarl" / "quickstart-sft"
    summary = json.loads((sft_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["weights"] == str(sft_dir / "final")
    assert (sft_dir / "final" / "config.json").is_file() and not (tmp_path / "runs").exists()

    assert main(["train", *small_run(tiny_task, "out", f"model.path={sft_dir / 'final'}")]) == 0
    run_dir = out / "stratarl" / "quickstart"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final weights"] == str(run_dir / "final") and summary["steps"].startswith("1..1")
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["model"]["path"] == str(sft_dir / "final")  # absolute, as every saved path
    assert saved["trainer"]["output_root"] == str(out) and saved["data"]["train_files"] == [
        str(tiny_task["train"])
    ]


def test_a_rerun_is_refused_with_exit_code_2(tiny_task, tmp_path, capsys):
    assert main(["train", *small_run(tiny_task, tmp_path)]) == 0
    capsys.readouterr()
    assert main(["train", *small_run(tiny_task, tmp_path)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "refusing to start in" in err and "trainer.overwrite=true" in err and "Traceback" not in err


def test_a_wrong_reward_function_name_is_found_before_the_model_loads(
    tiny_task, tmp_path, capsys, monkeypatch
):
    scorer = tmp_path / "score.py"
    scorer.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n"
    )
    from stratarl.assembly import roles

    def no_model(*args, **kwargs):
        raise AssertionError("a worker was built")

    monkeypatch.setattr(roles, "build_workers", no_model)
    extra = (f"reward.custom_function_path={scorer}", "reward.custom_function_name=compute_scor")
    assert main(["train", *small_run(tiny_task, tmp_path, *extra)]) == 2
    err = capsys.readouterr().err
    assert "has no function 'compute_scor'; it defines: compute_score" in err


def test_an_unknown_data_source_is_found_before_any_worker_starts(tiny_task, tmp_path, capsys, monkeypatch):
    """Was: the run crashed at the step that first sampled such a row."""
    from stratarl.assembly import roles
    from stratarl.data.schema import read_rows, write_rows

    rows = read_rows(tiny_task["train"])
    for i in (3, 7):
        rows[i]["data_source"] = "sort_numbers"
    write_rows(tmp_path / "mixed.parquet", rows)
    monkeypatch.setattr(roles, "build_workers", lambda *a, **k: pytest.fail("a worker was built"))
    assert (
        main(["train", *small_run(tiny_task, tmp_path, f"data.train_files=[{tmp_path / 'mixed.parquet'}]")])
        == 2
    )
    err = " ".join(capsys.readouterr().err.split())
    assert "data_source 'sort_numbers' has no reward function (2 rows:" in err
    assert "mixed.parquet row 3, " in err and "mixed.parquet row 7" in err


def test_the_quickstart_refuses_a_run_dir_that_is_not_empty(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["quickstart", "--run-dir", str(tmp_path)]) == 2
    assert "it is not empty" in capsys.readouterr().err


HELP_NAMES = {
    "train": [
        "trainer.total_steps",
        "rollout.n",
        "actor.lr",
        "model.path",
        "data.train_files",
        "trainer.save_freq",
    ],
    "sft": ["sft.total_steps", "sft.lr", "model.path", "data.train_files"],
    "verl": ["data.train_batch_size", "actor_rollout_ref.model.path", "--dry-run", "verl_translation.json"],
    "quickstart": ["sft.total_steps", "trainer.total_steps", "rollout.n"],
    "config": ["--as-verl", "stratarl verl"],
    "init": ["--val", "--reward", "docs/own_task.md"],
    "trace": ["--worst", "docs/debugging.md"],
    "doctor": ["--json", "docs/debugging.md"],
    "plot": ["--out"],
    "data make arithmetic": ["data.train_files"],
    "model import-gguf": ["model.path="],
    "explain-field": ["docs/fields.md"],
}


@pytest.mark.parametrize("command", list(HELP_NAMES))
def test_every_command_help_names_its_main_settings_and_points_to_the_config_docs(command, capsys):
    """Was: `train --help` said only "recipe" and "overrides"."""
    with pytest.raises(SystemExit):
        main([*command.split(), "--help"])
    out = capsys.readouterr().out
    assert "docs/config.md" in out
    assert all(name in out for name in HELP_NAMES[command]), out
    if command in ("train", "sft", "init"):  # every recipe file, by path
        assert all(f"recipes/{path.name}" in out for path in RECIPES.glob("*.yaml")), out


def test_config_prints_a_recipes_resolved_settings_and_names_a_missing_source(tmp_path, capsys):
    assert main(["config", str(RECIPES / "quickstart.yaml"), "rollout.n=3"]) == 0
    out = capsys.readouterr().out
    assert "rollout:" in out and "'n': 3" in out and "max_response_tokens:" in out  # resolved, not overrides
    assert main(["config", str(tmp_path / "nothing")]) == 2
    assert "no such run directory or recipe file" in capsys.readouterr().err
    assert main(["config", str(tmp_path)]) == 2  # a directory that is not a run
    assert "holds no config.yaml" in capsys.readouterr().err


def test_every_setting_the_help_names_is_a_config_key():
    from stratarl import cli_help
    from stratarl.config import load_config

    settings = [*cli_help.TRAIN_SETTINGS, *cli_help.SFT_SETTINGS, *cli_help.QUICKSTART_SETTINGS]
    for setting, _ in settings:
        key, value = setting.split("=", 1)
        if value in ("DIR", "NAME"):
            value = "x"
        load_config(None, [f"{key}={value}"])  # a ConfigError names an unknown key or a bad value


def test_help_imports_neither_torch_nor_transformers():
    code = (
        "import sys\n"
        "from stratarl.cli import main\n"
        "for command in (['train'], ['verl'], ['sft'], ['init'], ['doctor'], []):\n"
        "    try:\n"
        "        main([*command, '--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.splitlines()[-1] == "[]", out.stdout + out.stderr


def test_a_parquet_missing_a_column_is_one_line_per_problem_printed_once(tiny_task, tmp_path, capsys):
    """Was: one message per row (five, then "... and 1995 more"), the block printed twice, and a
    missing data_source read "got NoneType None"."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from stratarl.data.schema import read_rows

    row = read_rows(tiny_task["train"])[0]
    rows = [{**row, "data_source": None if i < 10 else row["data_source"]} for i in range(2000)]
    bad = tmp_path / "no_reward_model.parquet"
    pq.write_table(pa.Table.from_pylist(rows).drop_columns(["reward_model"]), bad)
    assert main(["train", *small_run(tiny_task, tmp_path, f"data.train_files=[{bad}]")]) == 2
    err = capsys.readouterr().err
    assert err.count("malformed:") == 2 and err.count("2000 rows from 1 file(s)") == 1, err
    assert f"malformed: data_source is missing (null): 10 rows ({bad} rows 0, 1, 2, 3, 4, …)" in err
    assert f"malformed: reward_model column is missing: 1990 rows ({bad} rows 10, 11, 12, 13, 14, …)" in err
    assert "NoneType" not in err and "more malformed" not in err and "Traceback" not in err
