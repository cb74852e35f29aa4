"""Two FSDP2 critic ranks as Ray actors: values and an update as one in-process critic, checkpoints
that load into either backend, and a killed rank named with its role, rank and phase."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray")

from stratarl.cluster.critic_group import CriticWorkerGroup  # noqa: E402
from stratarl.cluster.critic_worker import CriticWorker  # noqa: E402
from stratarl.cluster.placement import PlacementError, WorkerSizes, make_plan  # noqa: E402
from stratarl.cluster.queue_rows import KEY, QueueRows  # noqa: E402
from stratarl.cluster.ranks import WorkerError  # noqa: E402
from stratarl.cluster.ray_cluster import start_or_join  # noqa: E402
from stratarl.cluster.ray_critic_group import start_critic_group  # noqa: E402
from stratarl.cluster.run_checkpoint import RunCheckpoint  # noqa: E402
from stratarl.cluster.transfer_queue_ray import ray_transfer_queue  # noqa: E402
from stratarl.cluster.worker_group import PolicyWorkerGroup  # noqa: E402
from stratarl.engine.checkpoint import CheckpointManager  # noqa: E402
from stratarl.engine.critic import load_value_model  # noqa: E402
from stratarl.engine.requests import UpdateRequest  # noqa: E402
from stratarl.transport.data_proto import DataProto  # noqa: E402
from stratarl.transport.kv_meta import QUEUED_FIELDS, KVBatchMeta  # noqa: E402
from tests.cluster.tiny_specs import critic_spec, policy_spec  # noqa: E402
from tests.engine.test_critic import value_loss  # noqa: E402
from tests.engine.test_data_parallel import tolerance  # noqa: E402
from tests.engine.tiny_batches import ragged_batch, tiny_model  # noqa: E402

pytestmark = pytest.mark.ray
ROLES = ["actor", "rollout", "critic"]


@pytest.fixture(scope="module")
def cluster():
    os.environ.pop("RAY_ADDRESS", None)
    session = start_or_join(None, num_cpus=2)  # a private local cluster
    yield
    session.shutdown()


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("policy")
    tiny_model(0, layers=2).save_pretrained(model_dir)  # a causal LM: the critic draws a fresh head
    return critic_spec(model_dir, init_seed=3)


@pytest.fixture(scope="module")
def group(cluster, spec):
    # The colocated plan of a PPO run on 2 CPUs: each 1-CPU bundle holds a policy and a critic
    # process of half a CPU each; with no policy group here, the critic reserves the pool itself.
    plan = make_plan("colocated", WorkerSizes(training_workers=2), ROLES)
    group = start_critic_group(spec, plan, call_timeout_s=120)
    yield group
    group.shutdown()


def with_returns(batch: DataProto, critic: CriticWorker, seed: int = 1) -> DataProto:
    mask = batch["response_mask"].float()
    returns = torch.randn(mask.shape, generator=torch.Generator().manual_seed(seed)) * mask
    return batch.union(critic.compute_values(batch)).union(DataProto.from_dict({"returns": returns}))


def test_a_plan_without_the_critic_fails_before_any_process_starts(cluster, spec):
    plan = make_plan("colocated", WorkerSizes(training_workers=2))  # made without the critic
    with pytest.raises(PlacementError, match="places no critic") as caught:
        start_critic_group(spec, plan)
    assert caught.value.keys == {"cluster.placement", "critic.enable"}
    assert ray.util.placement_group_table() == {}  # nothing reserved, nothing started


def test_two_ray_ranks_give_the_values_of_one_process(group, spec):
    single = CriticWorker(spec)  # the same seeded head as every rank's
    batch = ragged_batch(n=7, seed=5)  # 7 rows over 2 ranks: one pad row
    torch.testing.assert_close(
        group.compute_values(batch)["values"], single.compute_values(batch)["values"], atol=2e-5, rtol=1e-5
    )
    traffic = group.controller_bytes()
    assert traffic["controller/sent_bytes"] > batch["input_ids"].numel() * 8  # the scoring columns went


def test_two_ray_ranks_update_like_one_process(group, spec, tmp_path):
    single = CriticWorker(spec)
    batch = with_returns(ragged_batch(n=6, seed=2), single)
    by_3 = UpdateRequest(mini_batch_size=3)  # 2 steps of 3 rows: 1 pad row each
    one = single.update_critic(batch, value_loss, by_3)
    two = group.update_critic(batch, value_loss, by_3)
    assert two["critic/zero_weight_pad_rows"] == 2.0
    assert two["critic/vf_loss"] == pytest.approx(one["critic/vf_loss"], rel=1e-5, abs=1e-7)
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    saved = load_value_model(group.save_pretrained(tmp_path / "two")).state_dict()
    for name, tensor in single.critic.model.state_dict().items():
        torch.testing.assert_close(saved[name], tensor, atol=tolerance(name), rtol=0)
    probe = ragged_batch(n=5, seed=9)
    torch.testing.assert_close(
        group.compute_values(probe)["values"], single.compute_values(probe)["values"], atol=1e-5, rtol=1e-5
    )


def test_a_checkpoint_of_the_ray_critic_restores_it_and_loads_in_one_process(group, spec, tmp_path):
    policy = PolicyWorkerGroup.in_process(policy_spec(spec.model.path))
    checkpoint = RunCheckpoint(tmp_path, policy=policy, critic=group)
    probe = ragged_batch(n=5, seed=9)
    at_save = group.compute_values(probe)["values"]
    path = checkpoint.save(4, tokenizer=None, trainer_state={"global_step": 4})
    assert not list(tmp_path.glob(".staged-*")) and (path / "critic" / "optimizer.pt").is_file()
    group.update_critic(with_returns(probe, group, seed=3), value_loss, UpdateRequest(mini_batch_size=5))
    assert not torch.allclose(group.compute_values(probe)["values"], at_save)  # it trained on
    loaded = checkpoint.load()
    assert loaded.step == 4 and loaded.trainer_state == {"global_step": 4, "lineage": None}  # no run named
    torch.testing.assert_close(group.compute_values(probe)["values"], at_save, atol=0, rtol=0)
    in_process = CriticWorkerGroup.in_process(dataclasses.replace(spec, init_seed=11))  # another head
    RunCheckpoint(tmp_path, policy=policy, critic=in_process).load(directory=path)
    torch.testing.assert_close(in_process.compute_values(probe)["values"], at_save, atol=2e-5, rtol=1e-5)


def queued_like_a_ray_rollout(batch: DataProto, rows: QueueRows) -> DataProto:
    """The controller's view after a Ray rollout: row keys, and the bulk columns only in the queue."""
    keyed = batch.union(
        DataProto.from_dict(non_tensors={KEY: np.array(rows.new_keys(len(batch)), dtype=object)})
    )
    bulk = ["input_ids", "position_ids"]
    meta = rows.sync(keyed, bulk)
    controller = keyed.select([c for c in keyed.columns if c not in bulk])
    controller.meta_info[QUEUED_FIELDS] = {name: meta.fields[name] for name in bulk}
    return controller


def test_values_and_an_update_through_the_transfer_queue_are_the_direct_paths(group, tmp_path):
    rows = QueueRows(ray_transfer_queue(2))
    queued = CriticWorkerGroup(group.ranks, path=rows)  # the same ranks, fed by references
    batch = with_returns(ragged_batch(n=7, seed=6), group)
    controller = queued_like_a_ray_rollout(batch, rows)
    values = queued.compute_values(controller)["values"]
    assert torch.equal(values, batch["values"])
    stored = rows.queue.get(KVBatchMeta(rows.partition, list(controller[KEY])), fields=["values"])
    assert torch.equal(stored["values"], values)  # written back for the next phase's ranks

    group.stage_checkpoint(tmp_path, 1)  # rewind point: both updates start from this state
    CheckpointManager(tmp_path).save(1, {}, staged=["critic"])
    by_7 = UpdateRequest(mini_batch_size=7)  # 1 pad row
    through_queue = queued.update_critic(controller, value_loss, by_7)
    after_queue = group.compute_values(batch)["values"]
    group.load_checkpoint(tmp_path, 1)
    direct = group.update_critic(batch, value_loss, by_7)
    assert through_queue["critic/vf_loss"] == direct["critic/vf_loss"]
    assert through_queue["critic/zero_weight_pad_rows"] == direct["critic/zero_weight_pad_rows"] == 1.0
    assert torch.equal(after_queue, group.compute_values(batch)["values"])
    rows.queue.units.shutdown()


def test_a_critic_rank_killed_mid_update_is_named_within_the_timeout(group, spec):
    batch = with_returns(ragged_batch(n=8, seed=4), CriticWorker(spec))
    group.ranks.timeout_s = 30.0
    victim = group.ranks.pids()[1]
    threading.Timer(1.0, os.kill, (victim, signal.SIGKILL)).start()
    start = time.monotonic()
    with pytest.raises(WorkerError) as caught:  # 400 optimizer steps: far longer than 1 s
        group.update_critic(batch, value_loss, UpdateRequest(mini_batch_size=4, epochs=200))
    elapsed = time.monotonic() - start
    error = caught.value
    print(f"\n{error} (after {elapsed:.1f} s)")
    assert error.role == "critic" and error.phase == "critic.update" and 1 in error.ranks
    assert error.reasons[1].startswith("died"), error.reasons
    assert elapsed < 30.0, f"the error took {elapsed:.1f} s"
    with pytest.raises(WorkerError, match="not called"):  # the group is stopped, not left half-alive
        group.compute_values(batch)
