"""Two FSDP2 ranks as Ray actors (colocated): they score and update as one process; a killed rank is named."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

ray = pytest.importorskip("ray")

from stratarl.cluster.placement import PlacementError, WorkerSizes, make_plan  # noqa: E402
from stratarl.cluster.policy_worker import PolicyWorker  # noqa: E402
from stratarl.cluster.ranks import WorkerError  # noqa: E402
from stratarl.cluster.ray_cluster import start_or_join  # noqa: E402
from stratarl.cluster.ray_policy_group import start_policy_group  # noqa: E402
from stratarl.cluster.worker_group import PolicyWorkerGroup  # noqa: E402
from stratarl.engine.requests import UpdateRequest  # noqa: E402
from stratarl.rollout.interface import SamplingParams  # noqa: E402
from tests.cluster.test_worker_group import prompts, with_advantages  # noqa: E402
from tests.cluster.tiny_specs import policy_spec  # noqa: E402
from tests.engine.test_data_parallel import tolerance  # noqa: E402
from tests.engine.tiny_batches import policy_gradient_loss, tiny_model  # noqa: E402

pytestmark = pytest.mark.ray
SAMPLING = SamplingParams(temperature=1.0, max_tokens=5)


@pytest.fixture(scope="module")
def cluster():
    os.environ.pop("RAY_ADDRESS", None)
    session = start_or_join(None, num_cpus=2)  # a private local cluster: address="local", own temp dir
    assert session.started and session.temp_dir.startswith("/tmp/srl-ray-")
    yield
    session.shutdown()


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("policy")
    tiny_model(0, layers=2).save_pretrained(model_dir)
    return policy_spec(model_dir)


@pytest.fixture(scope="module")
def group(cluster, spec):
    plan = make_plan("colocated", WorkerSizes(training_workers=2))
    group = start_policy_group(spec, plan, call_timeout_s=120)
    yield group
    group.shutdown()


def test_impossible_plan_fails_before_any_actor_starts(cluster, spec):
    plan = make_plan("split", WorkerSizes(training_workers=2))  # 3 CPUs on a 2-CPU cluster
    with pytest.raises(PlacementError, match="needs 3 CPUs"):
        start_policy_group(spec, plan)
    assert ray.util.placement_group_table() == {}  # no pool was reserved
    assert ray.available_resources().get("CPU") == 2.0  # and no actor holds a CPU


def test_two_ray_ranks_score_each_row_like_one_process(group, spec):
    single = PolicyWorker(spec)
    rollout = single.generate(prompts(7, seed=5), SAMPLING, seed=0)  # 7 rows: one pad row
    torch.testing.assert_close(
        group.compute_log_prob(rollout)["old_log_probs"],
        single.compute_log_prob(rollout)["old_log_probs"],
        atol=2e-5,
        rtol=1e-5,
    )


def test_two_ray_ranks_update_like_one_process_then_serve_the_new_weights(group, spec, tmp_path):
    single = PolicyWorkerGroup.in_process(spec)
    batch = with_advantages(single.generate(prompts(8, seed=2), SAMPLING, seed=1))
    by_4 = UpdateRequest(mini_batch_size=4)  # 2 optimizer steps
    one = single.update_actor(batch, policy_gradient_loss, by_4)
    two = group.update_actor(batch, policy_gradient_loss, by_4)
    assert two["pg_loss"] == pytest.approx(one["pg_loss"], rel=1e-5, abs=1e-7)
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    saved = AutoModelForCausalLM.from_pretrained(group.save_pretrained(tmp_path / "two")).state_dict()
    expected = single.local_worker().actor.model.state_dict()
    for name, tensor in expected.items():
        torch.testing.assert_close(saved[name], tensor, atol=tolerance(name), rtol=0)
    assert group.sync_weights().version == 1 == group.weight_version  # both ranks' engines
    generated = group.generate(prompts(6), SAMPLING, seed=4)
    assert generated["weight_version"].tolist() == [1] * 6
    traffic = group.controller_bytes()
    print(f"\ncontroller bytes since start: {traffic}")
    assert traffic["controller/sent_bytes"] > batch["input_ids"].numel() * 8  # the batch went out


def test_a_rank_killed_mid_update_is_named_within_the_timeout(group, spec):
    single = PolicyWorker(spec)
    batch = with_advantages(single.generate(prompts(8, seed=3), SAMPLING, seed=2))
    group.ranks.timeout_s = 30.0
    victim = group.ranks.pids()[1]
    threading.Timer(1.0, os.kill, (victim, signal.SIGKILL)).start()
    start = time.monotonic()
    with pytest.raises(WorkerError) as caught:  # 400 optimizer steps: far longer than 1 s
        group.update_actor(batch, policy_gradient_loss, UpdateRequest(mini_batch_size=4, epochs=200))
    elapsed = time.monotonic() - start
    error = caught.value
    print(f"\n{error} (after {elapsed:.1f} s)")
    assert error.role == "actor" and error.phase == "actor.update" and 1 in error.ranks
    assert error.reasons[1].startswith("died"), error.reasons
    assert elapsed < 30.0, f"the error took {elapsed:.1f} s"
    with pytest.raises(WorkerError, match="not called"):  # the group is stopped, not left half-alive
        group.compute_log_prob(batch)
