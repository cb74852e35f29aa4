"""Layer 1, config: what a Hugging Face model or tokenizer directory must hold, checked before loading.

`from_pretrained` on a directory with a missing file fails deep inside transformers, often after
workers have started, with a message that names neither the setting nor the file. These checks run
in `validate_config` and name the key, the directory and the missing file.
"""

from __future__ import annotations

import json
from pathlib import Path

from stratarl.config.errors import ConfigProblem

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
VOCABULARY_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")


def model_dir_problems(key: str, path: str) -> list[ConfigProblem]:
    """A model directory needs config.json and its weights (every shard an index names)."""
    root = Path(path)
    if not root.is_dir():
        return [ConfigProblem((key,), f"directory not found: {path}")]
    problems = []
    if not (root / "config.json").is_file():
        problems.append(
            ConfigProblem((key,), f"{path} has no config.json: not a Hugging Face model directory")
        )
    weights = [name for name in WEIGHT_FILES if (root / name).is_file()]
    if not weights:
        problems.append(
            ConfigProblem((key,), f"{path} has no weights: expected one of {', '.join(WEIGHT_FILES)}")
        )
    for index in (name for name in weights if name.endswith(".index.json")):
        problems += _missing_shards(key, root, index)
    return problems


def tokenizer_dir_problems(key: str, path: str, *, because: str = "") -> list[ConfigProblem]:
    """A tokenizer directory needs tokenizer_config.json (or config.json) and a vocabulary file.
    because: why the tokenizer is read from this directory (e.g. "model.tokenizer_path is empty")."""
    root = Path(path)
    if not root.is_dir():
        return [ConfigProblem((key,), f"directory not found: {path}")]
    where = f" (the tokenizer is read from here: {because})" if because else ""
    problems = []
    if not any((root / name).is_file() for name in ("tokenizer_config.json", "config.json")):
        problems.append(
            ConfigProblem((key,), f"{path} has no tokenizer_config.json (nor config.json){where}")
        )
    if not any((root / name).is_file() for name in VOCABULARY_FILES):
        message = f"{path} has no tokenizer vocabulary: expected one of {', '.join(VOCABULARY_FILES)}{where}"
        problems.append(ConfigProblem((key,), message))
    return problems


def _missing_shards(key: str, root: Path, index: str) -> list[ConfigProblem]:
    try:
        weight_map = json.loads((root / index).read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        return [ConfigProblem((key,), f"{root / index} is not a weight index ({err})")]
    missing = sorted({shard for shard in weight_map.values() if not (root / shard).is_file()})
    if not missing:
        return []
    return [ConfigProblem((key,), f"{root} misses shard(s) named by {index}: {', '.join(missing[:5])}")]
