"""Builders: data.max_*_prompts keeps every prompt at -1 and a seeded subsample below the total; the
critic builder's two backends; the placement plan counts a reward model's pool, whose builder (like
the critic's) needs the policy group on Ray, and the watchdog arms its process."""

import pytest
from transformers import AutoTokenizer

from stratarl.assembly import run_watch
from stratarl.assembly.datasets import load_prompts
from stratarl.assembly.roles import build_critic_worker, placement_plan
from stratarl.assembly.scoring import build_reward_model
from stratarl.cluster.placement import Bundle, PlacementError, validate_plan
from stratarl.config import load_config
from stratarl.reward.manager import RewardManager


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


def test_the_plan_counts_a_reward_models_pool_and_its_builder_needs_the_policy_group_on_ray(task):
    ray = [f"model.path={task['model']}", "cluster.backend=ray", "cluster.training_workers=2"]
    with_rm = [*ray, "reward.model.enable=true", f"reward.model.path={task['model']}", "reward.model.cpus=2"]
    plan = placement_plan(load_config(None, [*with_rm, "reward.model.gpus=1"]))
    assert plan.roles["reward_model"] == "reward_model"
    assert plan.pool_of("reward_model").bundles == (Bundle(2.0, 1.0),)
    assert plan.pool_of("actor").cpus == 2.0 and sum(pool.cpus for pool in plan.pools) == 4.0
    with pytest.raises(PlacementError, match="needs 4 CPUs") as caught:
        validate_plan(plan, roles=["actor", "rollout"], cluster_cpus=3, cluster_gpus=1)
    assert "reward.model.cpus" in caught.value.keys
    assert "reward_model" not in placement_plan(load_config(None, ray)).roles  # no reward model, no pool
    split = placement_plan(load_config(None, [*with_rm, "cluster.placement=split"]))
    assert [pool.name for pool in split.pools] == ["training", "rollout", "reward_model"]
    with pytest.raises(TypeError, match="build the policy first and pass it as policy="):
        build_reward_model(load_config(None, with_rm))  # its process needs the pool the policy reserved


def test_the_watchdog_arms_the_reward_models_process_beside_the_policys_and_the_critics():
    class Model:
        def score_conversations(self, conversations):
            raise AssertionError("not called")

        def close(self):
            pass

    model = Model()
    rewards = RewardManager(None, model=model)
    assert run_watch.watched_workers("policy", "critic", rewards) == {
        "actor": "policy",
        "critic": "critic",
        "reward_model": model,
    }
    assert run_watch.watched_workers("policy", None, RewardManager.in_process(len))["reward_model"] is None
