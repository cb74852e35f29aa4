"""A short run's outputs as a user reads them: TensorBoard and W&B mirror metrics.jsonl at the true
global step, validations do not shift the step count, and the batch metrics use the config's limits."""

import subprocess
import sys

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from stratarl.observe.data_metrics import data_metrics
from stratarl.observe.run_log import read_metrics
from stratarl.trainer.rl_trainer import RLTrainer
from stratarl.transport.data_proto import DataProto
from tests.observe.test_loggers import scalars, wandb_history
from tests.trainer.test_rl_trainer import small_config


def test_tensorboard_and_wandb_mirror_metrics_jsonl_by_global_step(task, tmp_path):
    cfg = small_config(
        task,
        "trainer.logger=[console,jsonl,tensorboard,wandb]",
        "trainer.test_freq=1",
        "trainer.total_steps=2",
    )
    RLTrainer(cfg, tmp_path / "run").fit()
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    train = [r for r in records if r["phase"] == "train"]
    assert [r["phase"] for r in records] == ["data", "val", "train", "val", "train", "val"]
    # the step counter is the step, not the number of records so far (3 validations ran)
    assert [r["training/global_step"] for r in train] == [1.0, 2.0]

    tb = scalars(tmp_path / "run" / "tensorboard", "critic/score/mean")
    assert [s for s, _ in tb] == [1, 2]
    assert [v for _, v in tb] == pytest.approx([r["critic/score/mean"] for r in train])
    val_key = "val-core/arithmetic/acc/mean@1"
    val = [r for r in records if r["phase"] == "val"]
    tb_val = scalars(tmp_path / "run" / "tensorboard", val_key)
    assert [s for s, _ in tb_val] == [r["step"] for r in val] == [0, 1, 2]
    assert [v for _, v in tb_val] == pytest.approx([r[val_key] for r in val])

    images = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    images.Reload()
    assert images.Tags()["images"] == ["curves"]

    rows = {int(r["_step"]): r for r in wandb_history(tmp_path / "run")}
    assert sorted(rows) == [0, 1, 2]
    for r in train:
        assert float(rows[r["step"]]["actor/pg_loss"]) == pytest.approx(r["actor/pg_loss"])
    assert rows[2]["curves/_type"] == '"image-file"'  # the run's curves at the last step
    (offline_run,) = (tmp_path / "run").glob("wandb/offline-run-*")
    dry_run = subprocess.run(
        [sys.executable, "-m", "wandb", "sync", "--dry-run", str(offline_run)],
        capture_output=True, text=True, timeout=120, env={"WANDB_MODE": "offline", "PATH": ""},
    )  # fmt: skip
    assert dry_run.returncode == 0 and "Would sync 1 run" in dry_run.stdout + dry_run.stderr


def test_a_logger_list_without_jsonl_still_writes_the_runs_record(task, tmp_path):
    """verl's lists (`[console, tensorboard]`) name no jsonl: metrics.jsonl is written anyway."""
    cfg = small_config(
        task, "trainer.logger=[console,tensorboard]", "trainer.total_steps=1", "trainer.test_freq=0"
    )
    RLTrainer(cfg, tmp_path / "run").fit()
    (train,) = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["phase"] == "train"]
    assert [s for s, _ in scalars(tmp_path / "run" / "tensorboard", "actor/pg_loss")] == [1]
    assert scalars(tmp_path / "run" / "tensorboard", "actor/pg_loss")[0][1] == pytest.approx(
        train["actor/pg_loss"]
    )


def test_prompt_clip_ratio_counts_prompts_at_the_configured_limit():
    # 3 prompts of 2, 3 and 4 tokens, left-padded to the batch's width 4; responses of 2 tokens.
    attention = torch.tensor([[0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    batch = DataProto.from_dict({"attention_mask": attention, "response_mask": attention[:, 4:]})
    # The padded width (4) is the longest prompt, so the old comparison always found one at "the limit".
    assert data_metrics(batch, max_prompt_tokens=8)["prompt_length/clip_ratio"] == 0.0
    assert data_metrics(batch, max_prompt_tokens=4)["prompt_length/clip_ratio"] == pytest.approx(1 / 3)
    assert data_metrics(batch, max_prompt_tokens=3)["prompt_length/clip_ratio"] == pytest.approx(2 / 3)
