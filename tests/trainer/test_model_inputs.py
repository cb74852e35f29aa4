"""The model and tokenizer a run is given: a tokenizer without a pad token trains (padding with EOS,
said in the log); a model directory with a missing file stops the run before anything loads."""

import json
import shutil

import pytest

from stratarl.config import ConfigError
from stratarl.observe.run_log import read_metrics
from stratarl.trainer.rl_trainer import RLTrainer
from tests.trainer.test_rl_trainer import small_config


def test_a_tokenizer_without_a_pad_token_trains(task, tmp_path, caplog):
    model = shutil.copytree(task["model"], tmp_path / "model")
    settings = json.loads((model / "tokenizer_config.json").read_text())
    settings["pad_token"] = None  # absent, the tokenizer class would supply its own default
    (model / "tokenizer_config.json").write_text(json.dumps(settings))
    config = small_config(task, f"model.path={model}", "trainer.total_steps=1", "trainer.test_freq=1")
    trainer = RLTrainer(config, tmp_path / "run")
    assert trainer.tokenizer.pad_token_id == trainer.tokenizer.eos_token_id
    trainer.fit()
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["phase"] == "train"] == [
        1
    ]
    assert "has no pad token; padding with its EOS token" in caplog.text


def test_a_model_directory_without_weights_fails_before_anything_starts(task, tmp_path):
    model = shutil.copytree(task["model"], tmp_path / "model")
    (model / "model.safetensors").unlink()
    with pytest.raises(ConfigError) as err:
        RLTrainer(small_config(task, f"model.path={model}"), tmp_path / "never")
    assert f"{model} has no weights" in str(err.value) and "model.path" in str(err.value)
    assert not (tmp_path / "never").exists()  # nothing was started, not even the run directory
