"""Fixtures for the agent tests: a tokenizer trained on the tool task, a renderer, prompt rows."""

import pytest

from stratarl.agent.rendering import ChatRenderer
from stratarl.data.tasks.tool_arithmetic import make_tool_dataset
from stratarl.data.tokenizer_factory import corpus_from_parquet, train_tokenizer

EXTRA_TEXT = [
    "Error when executing tool: ValueError: not an arithmetic expression",
    "Error: could not parse tool call: tool call is not valid JSON",
    "That is not right. Check your work and answer again. Correct.",
    '<tool_call>{"name": "python", "arguments": {"code": "print(6*7)"}}</tool_call>',
]


@pytest.fixture(scope="session")
def tool_task(tmp_path_factory):
    return make_tool_dataset(tmp_path_factory.mktemp("tool_task"), n_train=40, n_test=8, seed=5)


@pytest.fixture(scope="session")
def tokenizer(tool_task):
    texts = corpus_from_parquet([tool_task["train"], tool_task["test"]]) + EXTRA_TEXT * 5
    return train_tokenizer(texts, vocab_size=512)


@pytest.fixture(scope="session")
def renderer(tokenizer):
    return ChatRenderer(tokenizer)


def prompt_row(renderer, question: str, **fields) -> dict:
    messages = [{"role": "system", "content": "Use the calculator."}, {"role": "user", "content": question}]
    return {"prompt_ids": renderer.prompt_ids(messages), "messages": messages, **fields}
