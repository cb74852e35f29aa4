"""`stratarl init` sizes a recipe and a tiny model from any verl parquet and checks the reward on it;
docs/own_task.md's commands run as written (with smaller step counts)."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from transformers import AutoConfig

from stratarl.cli import main
from stratarl.config import load_config, validate_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "sort_numbers"
# Appended to the doc's training commands: the same commands, a few steps long.
SHORTER = {
    "sft": ["sft.total_steps=3", "data.max_val_prompts=16"],
    "train": [
        "trainer.total_steps=1",
        "data.prompts_per_step=4",
        "actor.prompts_per_mini_batch=4",
        "actor.trajectories_per_micro_batch=32",
        "data.max_val_prompts=16",
    ],
}


@pytest.fixture(scope="module")
def sort_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("sort") / "data"
    subprocess.run(
        [
            sys.executable,
            str(EXAMPLE / "make_data.py"),
            "--out",
            str(out),
            "--n-train",
            "300",
            "--n-test",
            "20",
        ],
        check=True,
        capture_output=True,
    )
    return out


def test_init_sizes_the_recipe_from_the_data_and_the_model_to_fit(sort_data, tmp_path, capsys):
    out = tmp_path / "sort"
    reward = str(EXAMPLE / "reward.py")
    assert main(["init", str(sort_data / "train.parquet"), "--val", str(sort_data / "test.parquet"),
                 "--reward", reward, "--out", str(out)]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    answers = re.search(
        r"reference answer tokens \(with EOS\), 300 rows: \{'p50': \d+, 'p95': \d+, 'max': (\d+)\}", printed
    )
    assert answers and "mean reward of the reference answers: 1.000" in printed
    longest = int(answers.group(1))
    cfg = load_config(out / "recipe.yaml")
    validate_config(cfg)
    assert longest < cfg.rollout.max_response_tokens <= 2 * longest  # room for the longest answer
    assert cfg.reward.custom_function_path == reward and cfg.model.path == str(out / "model")
    assert cfg.sft.max_tokens == cfg.data.max_prompt_tokens + cfg.rollout.max_response_tokens
    positions = AutoConfig.from_pretrained(out / "model").max_position_embeddings
    assert positions >= cfg.data.max_prompt_tokens + cfg.rollout.max_response_tokens
    assert f"model.path={Path('runs') / 'stratarl' / 'sort-sft' / 'final'}" in printed


def test_init_checks_the_reward_on_the_data(sort_data, tmp_path, capsys):
    train = str(sort_data / "train.parquet")
    assert main(["init", train, "--out", str(tmp_path / "a")]) == 2  # no scorer for sort_numbers
    assert "data_source 'sort_numbers'" in capsys.readouterr().err
    reward = str(EXAMPLE / "reward.py")
    assert (
        main(["init", train, "--reward", reward, "--reward-function", "score", "--out", str(tmp_path / "b")])
        == 2
    )
    assert "has no function 'score'; it defines: compute_score" in capsys.readouterr().err
    lenient = tmp_path / "wrong.py"  # scores the reference answers 0: the reward is wrong, not the model
    lenient.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                       "    return float(solution_str == ground_truth)\n")  # fmt: skip
    assert main(["init", train, "--reward", str(lenient), "--out", str(tmp_path / "c")]) == 0
    assert "the reference answers score 0.000 on average under the reward" in capsys.readouterr().err


def _rows(path) -> list[str]:
    """Each row of a parquet file, as one comparable string."""
    import json

    import pyarrow.parquet as pq

    return [json.dumps(row, sort_keys=True) for row in pq.read_table(path).to_pylist()]


def test_init_splits_the_training_rows_between_sft_and_grpo(sort_data, tmp_path, capsys):
    """Disjoint parts of the training rows, every row in one: sft.train_files for SFT, data.train_files
    for GRPO (prompts SFT did not train on); the held-out files as given."""
    from stratarl.apps.task_init import init_task

    train, val, out = sort_data / "train.parquet", str(sort_data / "test.parquet"), tmp_path / "sort"
    reward = str(EXAMPLE / "reward.py")
    _, profile, _ = init_task([str(train)], out, val_files=[val], reward_file=reward, sft_share=0.5)
    print(*profile.lines(), sep="\n")  # what `stratarl init` prints
    sft_file, rl_file = out / "data" / "sft_train.parquet", out / "data" / "rl_train.parquet"
    cfg = load_config(out / "recipe.yaml")
    validate_config(cfg)
    assert (cfg.sft.train_files, cfg.data.train_files, cfg.data.val_files) == (
        [str(sft_file)],
        [str(rl_file)],
        [val],
    )
    sft_rows, rl_rows = _rows(sft_file), _rows(rl_file)
    assert (len(sft_rows), len(rl_rows)) == (150, 150)  # half of 300 rows
    assert not set(sft_rows) & set(rl_rows) and sorted(sft_rows + rl_rows) == sorted(_rows(train))
    printed = capsys.readouterr().out
    assert f"150 rows for SFT in {sft_file}, 150 other rows for GRPO in {rl_file}" in printed
    assert "rows: 300" in printed  # measured (and the tokenizer trained) on every row


def test_the_split_follows_the_share_and_its_seed(sort_data, tmp_path):
    from stratarl.apps.task_init import split_rows

    train = [str(sort_data / "train.parquet")]
    split = split_rows(train, tmp_path / "a", 0.25)
    assert (split.sft_rows, split.rl_rows) == (75, 225) and len(_rows(split.sft_file)) == 75
    again = split_rows(train, tmp_path / "b", 0.25)
    other = split_rows(train, tmp_path / "c", 0.25, seed=1)
    assert _rows(again.sft_file) == _rows(split.sft_file) != _rows(other.sft_file)
    for share in (0.0, 1.0):  # no split: SFT and GRPO both train on every row
        assert split_rows(train, tmp_path / "d", share) is None
    assert not (tmp_path / "d").exists()
    with pytest.raises(ValueError, match=r"the SFT share 1\.5 is not between 0 and 1"):
        split_rows(train, tmp_path / "e", 1.5)
    with pytest.raises(ValueError, match="leaves SFT or GRPO no row"):
        split_rows(train, tmp_path / "f", 0.001)


@pytest.mark.parametrize("share", [None, 1.0, 0.0])
def test_init_without_a_split_keeps_one_training_file(sort_data, tmp_path, share):
    """The default (SFT_SHARE 1, measured in docs/own_task.md), share 1 and share 0: no split."""
    from stratarl.apps.task_init import init_task

    train, reward = str(sort_data / "train.parquet"), str(EXAMPLE / "reward.py")
    kwargs = {} if share is None else {"sft_share": share}
    recipe, profile, _ = init_task([train], tmp_path / "one", reward_file=reward, **kwargs)
    written = yaml.safe_load(recipe.read_text())
    assert written["data"]["train_files"] == [train] and "train_files" not in written["sft"]
    assert profile.split is None and not (tmp_path / "one" / "data").exists()
    assert load_config(recipe).sft.train_files == []  # SFT reads data.train_files


def doc_commands() -> list[str]:
    """The shell lines of docs/own_task.md's ```bash blocks, in order (comments dropped)."""
    text = (ROOT / "docs" / "own_task.md").read_text()
    blocks = re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M)
    lines = [line.split(" #")[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def test_the_own_task_walkthrough_runs_as_written(tmp_path):
    commands = doc_commands()
    assert [c.split()[:2] for c in commands] == [
        ["python", "examples/sort_numbers/make_data.py"],
        ["stratarl", "init"],
        ["stratarl", "sft"],
        ["stratarl", "train"],
        ["stratarl", "train"],  # the rerun: refused
    ]
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    for i, line in enumerate(commands):
        words = shlex.split(line)
        program = [sys.executable] if words[0] == "python" else [sys.executable, "-m", "stratarl"]
        extra = SHORTER.get(words[1], []) if words[0] == "stratarl" else []
        done = subprocess.run([*program, *words[1:], *extra], cwd=tmp_path, capture_output=True, text=True)
        if i == len(commands) - 1:  # the doc shows that running it again is refused, with exit code 2
            assert done.returncode == 2 and "refusing to start in" in done.stderr, done.stderr
        else:
            assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    run_dir = tmp_path / "runs" / "stratarl" / "sort"
    assert (run_dir / "final" / "config.json").is_file() and (run_dir / "summary.json").is_file()
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["rollout"]["max_response_tokens"] > 12


def test_init_with_a_model_of_your_own_measures_with_its_tokenizer(sort_data, tmp_path, capsys):
    train, reward = str(sort_data / "train.parquet"), str(EXAMPLE / "reward.py")
    assert main(["init", train, "--reward", reward, "--out", str(tmp_path / "first")]) == 0
    mine = tmp_path / "first" / "model"
    assert (
        main(["init", train, "--reward", reward, "--model", str(mine), "--out", str(tmp_path / "second")])
        == 0
    )
    assert f"for {mine}" in capsys.readouterr().out
    assert not (tmp_path / "second" / "model").exists()
    assert load_config(tmp_path / "second" / "recipe.yaml").model.path == str(mine)


def test_init_counts_a_models_parameters_from_its_weight_headers(sort_data, tmp_path):
    from transformers import AutoModelForCausalLM

    from stratarl.apps.task_init import ModelScale, count_parameters

    train, reward = str(sort_data / "train.parquet"), str(EXAMPLE / "reward.py")
    assert main(["init", train, "--reward", reward, "--out", str(tmp_path / "t")]) == 0
    model_dir = tmp_path / "t" / "model"
    assert count_parameters(model_dir) == AutoModelForCausalLM.from_pretrained(model_dir).num_parameters()
    assert not ModelScale.of(model_dir).pretrained  # init's own 1M model: the tiny path's numbers


@pytest.mark.parametrize(("parameters", "lr"), [(135_000_000, 1.0e-5), (7_000_000_000, 1.0e-6)])
def test_a_pretrained_models_recipe_has_fine_tuning_rates_not_the_tiny_models(sort_data, parameters, lr):
    """Was: `init --model PATH` wrote actor.lr 3e-4 and sft.lr 1e-3 (a random-init 1M model's) for any
    model, and 1.5 × the answer's tokens of response room (16 here), too few for a chat model."""
    from stratarl.apps.task_init import ModelScale, TaskProfile, starter_recipe

    profile = TaskProfile(rows=300, data_sources={"sort_numbers": 300}, prompt_tokens={"max": 50},
                          answer_tokens={"max": 10})  # fmt: skip
    files = {
        "train_files": [str(sort_data / "train.parquet")],
        "val_files": [str(sort_data / "test.parquet")],
    }
    common = dict(
        files, model_dir=Path("m"), reward_file="", reward_function="compute_score", experiment_name="x"
    )
    tiny = starter_recipe(profile, **common)
    tuned = starter_recipe(profile, **common, scale=ModelScale(parameters, pretrained=True))
    assert (tiny["actor"]["lr"], tiny["sft"]["lr"]) == (3.0e-4, 1.0e-3)
    assert (tuned["actor"]["lr"], tuned["sft"]["lr"]) == (lr, lr)
    assert tiny["rollout"]["max_response_tokens"] == 16 and tuned["rollout"]["max_response_tokens"] == 32
    assert tuned["rollout"]["temperature"] == 0.6 and tuned["data"]["prompts_per_step"] == 16
    for recipe in (tiny, tuned):  # SFT runs until held-out accuracy stops rising, total_steps a cap
        assert recipe["sft"]["test_freq"] > 0 and recipe["sft"]["stop_on_plateau"] == 3


@pytest.mark.real_model
def test_init_with_smollm2_writes_the_smollm2_recipes_scale(sort_data, tmp_path, capsys):
    from tests.data.real_model import real_model_dir

    train, reward = str(sort_data / "train.parquet"), str(EXAMPLE / "reward.py")
    out = tmp_path / "smol"
    assert main(["init", train, "--val", str(sort_data / "test.parquet"), "--reward", reward,
                 "--model", str(real_model_dir()), "--out", str(out)]) == 0  # fmt: skip
    assert re.search(r"model: 134\.\dM parameters, pretrained", capsys.readouterr().out)
    cfg = load_config(out / "recipe.yaml")
    validate_config(cfg)
    assert (cfg.actor.lr, cfg.sft.lr, cfg.rollout.temperature) == (1.0e-5, 1.0e-5, 0.6)
    assert cfg.rollout.max_response_tokens >= 32


def test_init_sft_share_splits_the_rows_between_sft_and_grpo(sort_data, tmp_path, capsys):
    out = tmp_path / "split"
    assert main(["init", str(sort_data / "train.parquet"), "--reward", str(EXAMPLE / "reward.py"),
                 "--out", str(out), "--sft-share", "0.5"]) == 0  # fmt: skip
    cfg = load_config(out / "recipe.yaml")
    assert cfg.sft.train_files == [str(out / "data" / "sft_train.parquet")]
    assert cfg.data.train_files == [str(out / "data" / "rl_train.parquet")]
    assert "150 rows for SFT" in capsys.readouterr().out
    assert main(["init", str(sort_data / "train.parquet"), "--reward", str(EXAMPLE / "reward.py"),
                 "--out", str(tmp_path / "bad"), "--sft-share", "1.5"]) == 2  # fmt: skip
    assert "not between 0 and 1" in capsys.readouterr().err
