"""One GRPO step through the trainer on every tiny-model family: weights move, the rollout's log-probs
equal the trainer's (1e-5), and the saved model reloads as the same architecture."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from stratarl.data.tiny_models import FAMILIES, build_tiny_model
from stratarl.data.tokenizer_factory import corpus_from_parquet
from stratarl.observe.run_log import read_metrics
from stratarl.trainer.rl_trainer import RLTrainer
from tests.trainer.test_rl_trainer import small_config


@pytest.fixture(scope="module")
def digits_reward(tmp_path_factory):
    """A reward with variance in every group (a random model never solves the task), so the policy
    gradient is not 0."""
    path = tmp_path_factory.mktemp("reward") / "digits.py"
    path.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return sum(c.isdigit() for c in solution_str) / 8\n"
    )
    return path


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_one_grpo_step(family, task, digits_reward, tmp_path):
    corpus = corpus_from_parquet([task["train"]])
    model_dir = build_tiny_model(tmp_path / "model", family=family, size="1m", corpus_texts=corpus, seed=0)
    cfg = small_config(
        {**task, "model": model_dir},
        "trainer.total_steps=1",
        "trainer.test_freq=0",
        f"reward.custom_function_path={digits_reward}",
        "algorithm.rollout_correction.rollout_is=token",  # logs rollout-vs-trainer log-prob gaps
    )
    trainer = RLTrainer(cfg, tmp_path / "run")
    before = {k: v.clone() for k, v in trainer.worker.local_worker().actor.model.state_dict().items()}
    trainer.fit()

    [record] = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["phase"] == "train"]
    assert record["actor/grad_norm"] > 0 and trainer.worker.weight_version == 1
    # the rollout engine and the trainer's forward give each sampled token the same log-prob
    gap = max(abs(record["rollout_corr/log_ppl_diff_max"]), abs(record["rollout_corr/log_ppl_diff_min"]))
    assert gap < 1e-5
    after = trainer.worker.local_worker().actor.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "no weight changed"
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final")
    assert type(reloaded).__name__ == type(AutoModelForCausalLM.from_pretrained(model_dir)).__name__
