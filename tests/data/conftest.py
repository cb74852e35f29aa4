"""Shared fixtures for the data tests: one small tokenizer and one small arithmetic dataset per session."""

import pytest

from stratarl.data.tasks.arithmetic import make_arithmetic_dataset
from stratarl.data.tokenizer_factory import corpus_from_parquet, train_tokenizer


@pytest.fixture(scope="session")
def arithmetic_paths(tmp_path_factory):
    out = tmp_path_factory.mktemp("arithmetic")
    return make_arithmetic_dataset(out, n_train=200, n_test=40, digits=(1, 2), operators="+-*", seed=3)


@pytest.fixture(scope="session")
def tokenizer(arithmetic_paths):
    texts = corpus_from_parquet([arithmetic_paths["train"], arithmetic_paths["test"]])
    return train_tokenizer(texts, vocab_size=512)
