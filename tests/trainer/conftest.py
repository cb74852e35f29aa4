"""Shared fixture of the trainer tests: a tiny arithmetic task and a 1M-parameter model, built once."""

import pytest

from stratarl.data.tasks.arithmetic import make_arithmetic_dataset
from stratarl.data.tiny_models import build_tiny_model
from stratarl.data.tokenizer_factory import corpus_from_parquet


@pytest.fixture(scope="session")
def task(tmp_path_factory):
    root = tmp_path_factory.mktemp("task")
    paths = make_arithmetic_dataset(root / "data", n_train=64, n_test=8, digits=1, seed=0)
    model = build_tiny_model(
        root / "model", size="1m", corpus_texts=corpus_from_parquet([paths["train"]]), seed=0
    )
    return {"train": paths["train"], "test": paths["test"], "model": model, "root": root}
