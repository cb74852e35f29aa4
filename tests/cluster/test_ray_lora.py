"""LoRA on Ray syncs as in one process: the base weights and adapter at the first sync, then the
adapter alone, into every colocated rank's engine (and, split, into the replicas); served = merged."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

ray = pytest.importorskip("ray")

from stratarl.cluster.placement import WorkerSizes, make_plan  # noqa: E402
from stratarl.cluster.ray_cluster import start_or_join  # noqa: E402
from stratarl.cluster.ray_policy_group import start_policy_group  # noqa: E402
from stratarl.cluster.rollout_sync import SplitSync  # noqa: E402
from stratarl.cluster.specs import LoraSpec  # noqa: E402
from stratarl.cluster.worker_group import PolicyWorkerGroup  # noqa: E402
from stratarl.engine.requests import UpdateRequest  # noqa: E402
from tests.cluster.test_ray_training import SAMPLING  # noqa: E402
from tests.cluster.test_worker_group import prompts, with_advantages  # noqa: E402
from tests.cluster.tiny_specs import policy_spec  # noqa: E402
from tests.engine.tiny_batches import policy_gradient_loss, tiny_model  # noqa: E402

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def cluster():
    os.environ.pop("RAY_ADDRESS", None)
    session = start_or_join(None, num_cpus=2)
    yield
    session.shutdown()


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("policy")
    tiny_model(0, layers=2).save_pretrained(model_dir)
    return dataclasses.replace(policy_spec(model_dir), lora=LoraSpec(4, 8.0, ("q_proj", "v_proj")))


def two_syncs(group: PolicyWorkerGroup) -> tuple:
    """An update, a sync, another update, another sync (the adapter moves from B = 0 each time)."""
    reports = []
    for seed in (1, 2):
        batch = with_advantages(group.generate(prompts(8, seed=seed), SAMPLING, seed=seed))
        group.update_actor(batch, policy_gradient_loss, UpdateRequest(mini_batch_size=4))
        reports.append(group.sync_weights())
    return tuple(reports)


def check_like_one_process(group: PolicyWorkerGroup, spec) -> None:
    single = PolicyWorkerGroup.in_process(spec)
    one = two_syncs(single)
    first, second = two_syncs(group)
    model_bytes = sum(
        t.numel() * t.element_size() for t in single.local_worker().rollout.model.state_dict().values()
    )
    print(f"\nsyncs on Ray: {first.num_bytes} then {second.num_bytes} bytes; one process: {one}")
    assert (first.version, second.version) == (1, 2) == (one[0].version, one[1].version)
    assert first.num_bytes > model_bytes  # the base weights, and the adapter
    # then A and B only, as in one process (measured: 24,896 then 1,792 bytes)
    assert second.num_bytes == one[1].num_bytes < model_bytes / 10
    after = group.generate(prompts(6, seed=7), SAMPLING, seed=4)
    assert after["weight_version"].tolist() == [2] * 6
    mask = after["response_mask"].bool()
    trained = group.compute_log_prob(after)["old_log_probs"]  # the adapted actor, sharded
    torch.testing.assert_close(after["rollout_log_probs"][mask], trained[mask], atol=1e-4, rtol=1e-4)


def test_colocated_ranks_sync_the_adapter_alone_after_the_base(cluster, spec):
    plan = make_plan("colocated", WorkerSizes(training_workers=2))
    with start_policy_group(spec, plan, call_timeout_s=120) as group:
        check_like_one_process(group, spec)


@pytest.mark.slow
def test_split_replicas_receive_the_adapter_alone_after_the_base(cluster, spec):
    plan = make_plan("split", WorkerSizes(training_workers=2, cpus_per_training_worker=0.5))
    with start_policy_group(spec, plan, call_timeout_s=120) as group:
        assert isinstance(group.rollout_sync, SplitSync)  # rank 0 pushes to the replica
        check_like_one_process(group, spec)
