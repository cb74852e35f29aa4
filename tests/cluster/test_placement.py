"""Placement plans: what goes where, impossible plans rejected naming keys, docs drawn from the plans."""

from pathlib import Path

import pytest

from stratarl.cluster.placement import (
    Bundle,
    PlacementError,
    PlacementPlan,
    ResourcePool,
    WorkerSizes,
    make_plan,
    validate_plan,
)
from stratarl.cluster.plan_diagram import DOC_PLANS, docs_section, render_mermaid

ROLES = ["actor", "rollout", "reference"]


def test_colocated_plan_puts_every_role_on_each_training_process():
    plan = make_plan("colocated", WorkerSizes(training_workers=2, cpus_per_training_worker=0.5))
    (pool,) = plan.pools
    assert pool.world_size == 2 and pool.cpus == 1.0
    assert plan.roles_on("policy") == ROLES
    assert plan.is_colocated("actor", "rollout") and plan.is_colocated("actor", "reference")
    assert pool.bundles[0].as_ray() == {"CPU": 0.5}  # no GPU key at 0: Ray rejects zero amounts
    assert pool.bundles[0].threads == 1  # a half-core process still gets one thread


def test_split_plan_gives_rollout_its_own_pool():
    sizes = WorkerSizes(
        training_workers=2, rollout_replicas=3, cpus_per_rollout_replica=2, gpus_per_training_worker=1
    )
    plan = make_plan("split", sizes, roles=["actor", "rollout", "reference", "critic"])
    assert [p.name for p in plan.pools] == ["training", "rollout"]
    assert plan.roles_on("training") == ["actor", "reference", "critic"]
    assert plan.roles_on("rollout") == ["rollout"]
    assert not plan.is_colocated("actor", "rollout")
    assert plan.pool_of("rollout").world_size == 3 and plan.pool_of("rollout").bundles[0].threads == 2
    assert plan.pool_of("actor").gpus == 2.0
    validate_plan(plan, roles=["actor", "rollout"], cluster_cpus=8, cluster_gpus=2)


def test_a_plan_that_fits_exactly_passes_and_one_cpu_more_fails_naming_the_sizes():
    fits = make_plan("split", WorkerSizes(training_workers=2, cpus_per_training_worker=0.5))
    validate_plan(fits, roles=ROLES, cluster_cpus=2)  # 2 × 0.5 + 1 × 1 = 2 CPUs
    too_big = make_plan("split", WorkerSizes(training_workers=2))
    with pytest.raises(PlacementError) as caught:
        validate_plan(too_big, roles=ROLES, cluster_cpus=2)
    assert "needs 3 CPUs (training 2, rollout 1), the cluster has 2" in str(caught.value)
    assert {"cluster.training_workers", "cluster.cpus_per_training_worker", "cluster.rollout_replicas",
            "cluster.num_cpus"} <= caught.value.keys  # fmt: skip


def test_gpu_demand_is_checked_like_cpus():
    plan = make_plan("colocated", WorkerSizes(training_workers=4, gpus_per_training_worker=1))
    with pytest.raises(PlacementError, match="needs 4 GPUs"):
        validate_plan(plan, roles=ROLES, cluster_cpus=64, cluster_gpus=2)


def test_role_without_pool_and_unknown_names_are_named():
    plan = make_plan("colocated", WorkerSizes())
    with pytest.raises(PlacementError) as caught:
        validate_plan(plan, roles=["actor", "critic", "judge"], cluster_cpus=4)
    message = str(caught.value)
    assert "role 'critic' has no pool in the 'colocated' plan" in message
    assert "role 'judge' is unknown" in message
    assert caught.value.keys == {"cluster.placement"}
    dangling = PlacementPlan("custom", (ResourcePool("a", (Bundle(),)),), {"actor": "b"})
    with pytest.raises(PlacementError, match="pool 'b', which the plan lacks"):
        validate_plan(dangling, roles=["actor"], cluster_cpus=4)
    with pytest.raises(PlacementError, match="unknown plan 'hybrid'") as caught:
        make_plan("hybrid", WorkerSizes())
    assert caught.value.keys == {"cluster.placement"}


def test_world_size_that_does_not_divide_the_batch_names_the_batch_keys():
    plan = make_plan("colocated", WorkerSizes(training_workers=3))
    rows = {("data.prompts_per_step", "rollout.n"): 24, ("actor.prompts_per_mini_batch", "rollout.n"): 8}
    with pytest.raises(PlacementError) as caught:
        validate_plan(plan, roles=ROLES, cluster_cpus=3, rows_per_rank_split=rows)
    (problem,) = caught.value.problems  # 24 splits over 3, 8 does not
    assert problem.keys == ("actor.prompts_per_mini_batch", "rollout.n", "cluster.training_workers")
    assert "8 rows do not split evenly over 3 training workers" in problem.message


def test_impossible_resource_amounts_and_empty_pools_are_rejected_together():
    plan = make_plan("split", WorkerSizes(training_workers=0, cpus_per_rollout_replica=1.5))
    with pytest.raises(PlacementError) as caught:
        validate_plan(plan, roles=ROLES, cluster_cpus=16)
    messages = [p.message for p in caught.value.problems]
    assert any("pool 'training' has no process" in m for m in messages)
    assert any("1.5 is not a share ≤ 1 or a whole number" in m for m in messages)
    no_resources = make_plan("colocated", WorkerSizes(cpus_per_training_worker=0))
    with pytest.raises(PlacementError, match="a process needs some CPU or GPU"):
        validate_plan(no_resources, roles=ROLES, cluster_cpus=16)


def test_drawing_shows_each_process_its_roles_and_the_weight_path():
    split = render_mermaid(make_plan("split", DOC_PLANS["split"][1]))
    assert 'training0["process 0<br/>actor · reference"]' in split
    assert "training0 ==>|weights in buckets| rollout0" in split
    assert "training0 <-.->|FSDP2 collectives| training1" in split
    colocated = render_mermaid(make_plan("colocated", DOC_PLANS["colocated"][1]))
    assert "weights in buckets" not in colocated  # each process loads its own engine
    assert colocated.count("actor · rollout · reference") == 2
    ppo = render_mermaid(make_plan("colocated", *DOC_PLANS["colocated-ppo"][1:3]))
    assert 'policy0_critic["process 0<br/>critic"]' in ppo  # its own process on bundle 0
    assert "policy0_critic <-.->|FSDP2 collectives| policy1_critic" in ppo  # its own group
    assert "policy0 <-.->|FSDP2 collectives| policy1" in ppo


def test_architecture_doc_pictures_are_generated_from_the_plans():
    doc = (Path(__file__).parents[2] / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert docs_section() in doc, "run: python -m stratarl.cluster.plan_diagram docs/architecture.md"


def test_a_critic_shares_each_training_bundle_with_the_policy_process():
    """Two processes per bundle (the policy's and the critic's), each asking for half of it and each
    using all of its threads, because they take turns."""
    sizes = WorkerSizes(training_workers=2, cpus_per_training_worker=2, gpus_per_training_worker=1)
    plan = make_plan("colocated", sizes, roles=[*ROLES, "critic"])
    (pool,) = plan.pools
    assert pool.processes_per_bundle == 2 and pool.cpus == 4.0  # the plan reserves no more
    assert pool.process_share(1) == Bundle(cpus=1.0, gpus=0.5) and pool.bundles[1].threads == 2
    split = make_plan("split", WorkerSizes(training_workers=2), roles=[*ROLES, "critic"])
    assert [pool.processes_per_bundle for pool in split.pools] == [2, 1]  # training, rollout
    assert make_plan("colocated", sizes).pools[0].process_share(0) == Bundle(2.0, 1.0)  # GRPO: alone
    validate_plan(plan, roles=ROLES, cluster_cpus=4, cluster_gpus=2)


def test_a_shared_bundle_of_several_gpus_is_rejected_naming_the_critic():
    plan = make_plan("colocated", WorkerSizes(gpus_per_training_worker=2), roles=[*ROLES, "critic"])
    with pytest.raises(PlacementError) as caught:
        validate_plan(plan, roles=ROLES, cluster_cpus=4, cluster_gpus=2)
    (problem,) = caught.value.problems
    assert {"cluster.gpus_per_training_worker", "critic.enable"} <= set(problem.keys)
    assert "2 processes (critic and the rest) share each bundle of 2 GPUs" in problem.message


def test_a_reward_model_is_a_pool_of_its_own_counted_with_the_others():
    sizes = WorkerSizes(training_workers=2, reward_model_cpus=2, reward_model_gpus=1)
    for name in ("colocated", "split"):
        plan = make_plan(name, sizes, roles=[*ROLES, "reward_model"])
        pool = plan.pool_of("reward_model")
        assert pool.name == "reward_model" and pool.bundles == (Bundle(2.0, 1.0),)
        assert plan.roles_on("reward_model") == ["reward_model"]  # no policy role shares its process
        assert not plan.is_colocated("reward_model", "actor")
        assert pool.process_share(0) == Bundle(2.0, 1.0)  # alone on its bundle
    assert "reward_model" not in {p.name for p in make_plan("colocated", sizes, ROLES).pools}
    plan = make_plan("colocated", sizes, roles=[*ROLES, "reward_model"])
    validate_plan(plan, roles=[*ROLES, "reward_model"], cluster_cpus=4, cluster_gpus=1)
    with pytest.raises(PlacementError) as caught:  # 2 training CPUs + the reward model's 2
        validate_plan(plan, roles=ROLES, cluster_cpus=3, cluster_gpus=0)
    messages = [p.message for p in caught.value.problems]
    assert "the plan needs 4 CPUs (policy 2, reward_model 2), the cluster has 3" in messages
    assert "the plan needs 1 GPUs (policy 0, reward_model 1), the cluster has 0" in messages
    assert {"reward.model.cpus", "reward.model.gpus"} <= caught.value.keys
    empty = make_plan("colocated", WorkerSizes(reward_model_cpus=0), roles=[*ROLES, "reward_model"])
    with pytest.raises(
        PlacementError, match="pool 'reward_model': a process needs some CPU or GPU"
    ) as caught:
        validate_plan(empty, roles=ROLES, cluster_cpus=16)
    assert caught.value.keys == {"reward.model.cpus", "reward.model.gpus"}


def test_the_drawing_shows_the_reward_model_reading_from_the_controller_not_the_queue():
    drawing = render_mermaid(make_plan("colocated", *DOC_PLANS["colocated-reward-model"][1:3]))
    assert 'subgraph reward_model["pool reward_model: 1 × {CPU 1}"]' in drawing
    assert 'reward_model0["process 0<br/>reward_model"]' in drawing
    assert "controller <-->|conversations · scores| reward_model0" in drawing
    assert "reward_model0 -->|rows| queue" not in drawing
    assert drawing.count("actor · rollout · reference") == 2  # the policy's processes are unchanged


def test_a_distillation_teacher_is_a_pool_of_its_own_counted_with_the_others():
    sizes = WorkerSizes(training_workers=2, teacher_cpus=1, teacher_gpus=1)
    for name in ("colocated", "split"):
        plan = make_plan(name, sizes, roles=[*ROLES, "teacher", "reward_model"])
        pool = plan.pool_of("teacher")
        assert pool.name == "teacher" and pool.bundles == (Bundle(1.0, 1.0),)
        assert plan.roles_on("teacher") == ["teacher"] and not plan.is_colocated("teacher", "actor")
        assert plan.pool_of("reward_model").name == "reward_model"  # both own pools, side by side
    assert "teacher" not in {p.name for p in make_plan("colocated", sizes, ROLES).pools}
    plan = make_plan("colocated", sizes, roles=[*ROLES, "teacher"])
    with pytest.raises(PlacementError) as caught:  # 2 training CPUs + the teacher's 1
        validate_plan(plan, roles=ROLES, cluster_cpus=2, cluster_gpus=1)
    messages = [p.message for p in caught.value.problems]
    assert "the plan needs 3 CPUs (policy 2, teacher 1), the cluster has 2" in messages
    assert {"distillation.cpus", "distillation.gpus"} <= caught.value.keys


def test_the_drawing_shows_the_teacher_reading_its_rows_from_the_queue():
    drawing = render_mermaid(make_plan("colocated", *DOC_PLANS["colocated-teacher"][1:3]))
    assert 'subgraph teacher["pool teacher: 1 × {CPU 1}"]' in drawing
    assert "controller -->|shard refs| teacher0" in drawing
    assert "teacher0 <-->|tokens · teacher columns| queue" in drawing
