"""A model or tokenizer directory with a missing file fails validation naming the key, directory and file."""

import json

import pytest

from stratarl.config import ConfigError, load_config, validate_config


def _files(root, *names):
    root.mkdir(parents=True, exist_ok=True)
    for name in names:
        (root / name).write_text("{}")
    return root


def _problems(tmp_path, model, **extra):
    (tmp_path / "train.parquet").touch()
    overrides = [f"data.train_files=[{tmp_path / 'train.parquet'}]", f"model.path={model}"]
    overrides += [f"{k}={v}" for k, v in extra.items()]
    with pytest.raises(ConfigError) as err:
        validate_config(load_config(None, overrides))
    return {(p.keys, p.message) for p in err.value.problems}


def test_missing_weights_and_config_are_named(tmp_path):
    model = _files(tmp_path / "m", "tokenizer_config.json", "tokenizer.json")
    problems = _problems(tmp_path, model)
    messages = " | ".join(m for keys, m in problems if keys == ("model.path",))
    assert f"{model} has no config.json" in messages
    assert "has no weights: expected one of model.safetensors" in messages


def test_a_missing_shard_of_an_index_is_named(tmp_path):
    model = _files(tmp_path / "m", "config.json", "tokenizer_config.json", "tokenizer.json")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    (model / "model-00001-of-00002.safetensors").touch()
    ((keys, message),) = _problems(tmp_path, model)
    assert keys == ("model.path",) and "model-00002-of-00002.safetensors" in message
    assert "model-00001" not in message


def test_a_tokenizer_without_vocabulary_is_named_with_the_key_it_came_from(tmp_path):
    model = _files(tmp_path / "m", "config.json", "model.safetensors", "tokenizer_config.json")
    ((keys, message),) = _problems(tmp_path, model)
    assert keys == ("model.path",) and "no tokenizer vocabulary" in message
    assert "model.tokenizer_path is empty" in message
    tokenizer = _files(tmp_path / "t", "vocab.json")
    ((keys, message),) = _problems(tmp_path, model, **{"model.tokenizer_path": tokenizer})
    assert keys == ("model.tokenizer_path",) and f"{tokenizer} has no tokenizer_config.json" in message


def test_a_reward_model_directory_is_checked_only_when_enabled(tmp_path):
    model = _files(
        tmp_path / "m", "config.json", "model.safetensors", "tokenizer_config.json", "tokenizer.json"
    )
    rm = _files(tmp_path / "rm", "config.json")
    problems = _problems(tmp_path, model, **{"reward.model.enable": "true", "reward.model.path": rm})
    assert {keys for keys, _ in problems} == {("reward.model.path",)}
    assert any("has no weights" in m for _, m in problems) and any("tokenizer" in m for _, m in problems)
