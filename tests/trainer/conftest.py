"""Shared fixtures of the trainer tests: a tiny arithmetic task and a 1M-parameter model, and the tool
task with a 1M model SFT taught to call the calculator, each built once."""

import pytest

from stratarl.assembly import datasets
from stratarl.data.tasks.arithmetic import make_arithmetic_dataset
from stratarl.data.tasks.tool_arithmetic import make_tool_dataset
from stratarl.data.tiny_models import build_tiny_model
from stratarl.data.tokenizer_factory import corpus_from_parquet
from stratarl.observe.run_log import RunLog
from stratarl.trainer.agent_sft import agent_sft_batch
from stratarl.trainer.sft import run_sft, sft_worker
from tests.trainer.planted_runs import sft_model


@pytest.fixture(scope="session")
def task(tmp_path_factory):
    root = tmp_path_factory.mktemp("task")
    paths = make_arithmetic_dataset(root / "data", n_train=64, n_test=8, digits=1, seed=0)
    model = build_tiny_model(
        root / "model", size="1m", corpus_texts=corpus_from_parquet([paths["train"]]), seed=0
    )
    return {"train": paths["train"], "test": paths["test"], "model": model, "root": root}


@pytest.fixture(scope="session")
def sft_task(task, tmp_path_factory):
    """The arithmetic task after a short SFT, shared by the doctor's real-run tests."""
    return sft_model(task, tmp_path_factory.mktemp("doctor"))


@pytest.fixture(scope="session")
def sft_tool_task(tmp_path_factory):
    """The tool task and a 1M model that SFT taught to call the calculator (all demonstrations use it),
    so that sampled episodes really contain tool calls."""
    root = tmp_path_factory.mktemp("tool_task")
    paths = make_tool_dataset(
        root / "data", n_train=64, n_test=6, digits=(3, 3), tool_fraction=1.0, with_instruction=False, seed=0
    )
    corpus = corpus_from_parquet([paths["train"]])
    task = {**paths, "model": build_tiny_model(root / "model", size="1m", corpus_texts=corpus, seed=0)}
    from tests.trainer.test_agent_rollout import tool_config

    cfg = tool_config(task, "sft.lr=3e-3")
    tokenizer = datasets.load_tokenizer(cfg)
    dataset = datasets.load_prompts(cfg.data.train_files, tokenizer, max_prompt_tokens=64, limit=None)
    worker = sft_worker(cfg, tokenizer, total_steps=60)
    log = RunLog(root / "sft")
    run_sft(worker, dataset, tokenizer, examples_per_step=16, total_steps=60, seed=0, log=log,
            make_batch=agent_sft_batch)  # fmt: skip
    worker.save_pretrained(root / "sft_model")
    tokenizer.save_pretrained(root / "sft_model")
    return {**task, "model": root / "sft_model"}
