"""Builders: data.max_*_prompts keeps every prompt at -1 and a seeded subsample below the total; the
critic builder's two backends."""

import pytest
from transformers import AutoTokenizer

from stratarl.config import load_config
from stratarl.trainer.builders import build_critic_worker, load_prompts


def test_max_prompts_minus_one_keeps_all_and_a_limit_subsamples_with_a_seed(task):
    tokenizer = AutoTokenizer.from_pretrained(task["model"])
    files = [str(task["train"])]

    def rows(limit, seed=0):
        dataset = load_prompts(files, tokenizer, max_prompt_tokens=64, limit=limit, seed=seed)
        return [item.source_row for item in dataset.items]

    everything = rows(None)
    assert len(everything) == 64
    assert rows(-1) == everything  # -1 once dropped the last prompt (items[:-1])
    ten = rows(10)
    assert len(ten) == 10 and ten == sorted(ten) and set(ten) <= set(everything)
    assert rows(10) == ten and rows(10, seed=1) != ten
    assert rows(64) == everything and rows(0) == []


def test_the_critic_builder_gives_one_worker_here_and_needs_the_policy_group_on_ray(task):
    overrides = [f"model.path={task['model']}", "algorithm.adv_estimator=gae", "critic.lr=3e-4"]
    critic = build_critic_worker(load_config(None, overrides), total_steps=3).local_worker()
    assert critic.critic.optimizer.param_groups[0]["lr"] == 3e-4
    on_ray = load_config(None, [*overrides, "cluster.backend=ray"])
    with pytest.raises(TypeError, match="build the policy first and pass it as policy="):
        build_critic_worker(on_ray, total_steps=3)  # its ranks need the policy group's pools
