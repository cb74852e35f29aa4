"""In-process critic group: one rank is the CriticWorker, two ranks keep row order, and a run
checkpoint whose save dies between the critic's part and the policy's leaves the previous one."""

import pytest
import torch

from stratarl.cluster.critic_group import CriticWorkerGroup
from stratarl.cluster.critic_worker import CriticWorker
from stratarl.cluster.ranks import InProcessRanks
from stratarl.cluster.run_checkpoint import RunCheckpoint
from stratarl.cluster.worker_group import PolicyWorkerGroup
from stratarl.engine.requests import UpdateRequest
from stratarl.transport.data_proto import DataProto
from tests.cluster.tiny_specs import critic_spec, policy_spec
from tests.engine.test_critic import value_loss
from tests.engine.tiny_batches import ragged_batch, tiny_model


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("policy")
    tiny_model(0, layers=2).save_pretrained(model_dir)
    return critic_spec(model_dir, init_seed=1)


def with_returns(batch, critic):
    returns = torch.randn(batch["response_mask"].shape, generator=torch.Generator().manual_seed(0))
    returns = returns * batch["response_mask"]
    return batch.union(critic.compute_values(batch)).union(DataProto.from_dict({"returns": returns}))


def test_one_in_process_rank_is_the_critic_worker(spec):
    group, worker = CriticWorkerGroup.in_process(spec), CriticWorker(spec)
    batch = with_returns(ragged_batch(n=6, seed=3), worker)
    assert torch.equal(group.compute_values(batch)["values"], batch["values"])
    metrics = group.update_critic(batch, value_loss, UpdateRequest(mini_batch_size=3))
    expected = worker.update_critic(batch, value_loss, UpdateRequest(mini_batch_size=3))
    assert (
        metrics["critic/vf_loss"] == expected["critic/vf_loss"]
        and "critic/zero_weight_pad_rows" not in metrics
    )
    assert torch.equal(group.compute_values(batch)["values"], worker.compute_values(batch)["values"])
    assert group.controller_bytes() == {"controller/sent_bytes": 0.0, "controller/received_bytes": 0.0}


def test_two_ranks_score_each_row_as_one_rank_and_keep_row_order(spec):
    workers = [CriticWorker(spec) for _ in range(2)]  # the same seeded head
    group = CriticWorkerGroup(InProcessRanks("critic", workers))
    batch = ragged_batch(n=7, seed=5)  # one pad row; rows reordered to balance the ranks' work
    torch.testing.assert_close(
        group.compute_values(batch)["values"], workers[0].compute_values(batch)["values"]
    )


def test_a_save_that_dies_after_the_critic_part_leaves_the_previous_checkpoint(spec, tmp_path):
    policy = PolicyWorkerGroup.in_process(policy_spec(spec.model.path))
    group = CriticWorkerGroup.in_process(spec)
    critic = group.local_worker()
    checkpoint = RunCheckpoint(tmp_path, policy=policy, critic=group)
    batch = with_returns(ragged_batch(n=4, seed=2), critic)
    checkpoint.save(1, tokenizer=None, trainer_state={"global_step": 1})
    at_step_1 = critic.compute_values(batch)["values"]
    critic.update_critic(batch, value_loss, UpdateRequest(mini_batch_size=4))
    critic.stage_checkpoint(tmp_path, 2)  # the critic's part of step 2, then the process dies
    assert checkpoint.steps() == [1] and (tmp_path / ".staged-global_step_2" / "critic").is_dir()
    assert checkpoint.load().step == 1
    assert torch.equal(critic.compute_values(batch)["values"], at_step_1)
    path = checkpoint.save(3, tokenizer=None, trainer_state={"global_step": 3})  # clears the leftovers
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert {"critic", "actor", "rng", "huggingface", "manifest.json"} <= {p.name for p in path.iterdir()}
