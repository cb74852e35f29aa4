"""BatchPlan follows verl's batch semantics: hand-computed numbers, and a plain loop that splits a step."""

import pytest
from rich.table import Table

from stratarl.config import BatchPlan, ConfigError, load_config

OVERRIDES = [
    "data.prompts_per_step=12",
    "rollout.n=4",
    "actor.prompts_per_mini_batch=3",
    "actor.trajectories_per_micro_batch=6",
    "actor.ppo_epochs=2",
    "data.max_prompt_tokens=100",
    "rollout.max_response_tokens=28",
]


def test_hand_computed_plan():
    plan = BatchPlan.from_config(load_config(None, OVERRIDES))
    assert plan.trajectories_per_step == 48  # N = B·n = 12·4
    assert plan.trajectories_per_mini_batch == 12  # 3 prompts · 4 samples
    assert plan.mini_batches_per_step == 4  # 12 prompts / 3 per mini-batch
    assert plan.optimizer_steps_per_step == 8  # 4 mini-batches · 2 epochs
    assert plan.micro_batches_per_mini_batch == 2  # 12 trajectories / 6 per micro-batch
    assert plan.gradient_accumulation_steps == 2
    assert plan.max_tokens_per_trajectory == 128  # 100 + 28
    assert plan.max_tokens_per_micro_batch == 768  # 6 · 128


def test_plan_matches_a_plain_loop_over_one_step():
    """Split a step's trajectories the way the actor update does, counting as we go."""
    cfg = load_config(None, OVERRIDES)
    plan = BatchPlan.from_config(cfg)
    B, n = cfg.data.prompts_per_step, cfg.rollout.n
    trajectories = [
        (prompt, sample) for prompt in range(B) for sample in range(n)
    ]  # n per prompt, interleaved
    per_mini = cfg.actor.prompts_per_mini_batch * n
    optimizer_steps, micro_counts, seen = 0, set(), []
    for _epoch in range(cfg.actor.ppo_epochs):
        for start in range(0, len(trajectories), per_mini):
            mini = trajectories[start : start + per_mini]
            micros = [
                mini[i : i + cfg.actor.trajectories_per_micro_batch]
                for i in range(0, len(mini), cfg.actor.trajectories_per_micro_batch)
            ]
            micro_counts.add(len(micros))
            assert {len(m) for m in micros} == {plan.trajectories_per_micro_batch}  # no ragged micro-batch
            assert len({prompt for prompt, _ in mini}) == plan.prompts_per_mini_batch  # whole groups only
            optimizer_steps += 1
            seen += mini
    assert optimizer_steps == plan.optimizer_steps_per_step
    assert micro_counts == {plan.micro_batches_per_mini_batch}
    assert len(seen) == plan.trajectories_per_step * plan.ppo_epochs


def test_indivisible_sizes_raise_naming_the_keys():
    with pytest.raises(ConfigError) as err:
        BatchPlan.from_config(load_config(None, [*OVERRIDES, "actor.trajectories_per_micro_batch=5"]))
    assert err.value.keys == {
        "actor.prompts_per_mini_batch",
        "rollout.n",
        "actor.trajectories_per_micro_batch",
    }
    with pytest.raises(ConfigError) as err:
        BatchPlan.from_config(load_config(None, [*OVERRIDES, "rollout.n=0"]))
    assert "rollout.n" in err.value.keys


def test_render_and_as_dict():
    plan = BatchPlan.from_config(load_config(None, OVERRIDES))
    table = plan.render()
    assert isinstance(table, Table) and table.row_count == len(plan.rows())
    text = plan.to_text()
    assert "trajectories per step (N)" in text and " 48 " in text
    numbers = plan.as_dict()
    assert numbers["optimizer_steps_per_step"] == 8 and numbers["prompts_per_step"] == 12
