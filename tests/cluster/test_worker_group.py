"""In-process worker group: one rank is the PolicyWorker, two ranks keep row order, errors name the rank."""

import dataclasses

import pytest
import torch

from stratarl.cluster.policy_worker import PolicyWorker
from stratarl.cluster.ranks import InProcessRanks, WorkerError
from stratarl.cluster.rollout_set import RolloutReplicas
from stratarl.cluster.worker_group import PolicyWorkerGroup
from stratarl.engine.requests import UpdateRequest
from stratarl.rollout.interface import SamplingParams
from stratarl.transport.data_proto import DataProto
from tests.cluster.tiny_specs import policy_spec
from tests.engine.tiny_batches import V, policy_gradient_loss, tiny_model

SAMPLING = SamplingParams(temperature=1.0, max_tokens=5)


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("policy")
    tiny_model(0, layers=2).save_pretrained(model_dir)
    return policy_spec(model_dir, with_reference=True)


def prompts(n: int, seed: int = 0) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    ids = [
        torch.randint(2, V, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n)
    ]
    return DataProto.from_dict(non_tensors={"raw_prompt_ids": ids})


def with_advantages(rollout: DataProto, seed: int = 1) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    advantages = torch.randn(rollout["response_mask"].shape, generator=g) * rollout["response_mask"]
    return rollout.union(DataProto.from_dict({"advantages": advantages}))


def test_one_in_process_rank_is_the_policy_worker(spec):
    group, worker = PolicyWorkerGroup.in_process(spec), PolicyWorker(spec)
    batch = prompts(6)
    out_group, out_worker = group.generate(batch, SAMPLING, seed=3), worker.generate(batch, SAMPLING, seed=3)
    for name in ("responses", "input_ids", "response_mask", "rollout_log_probs", "weight_version"):
        assert torch.equal(out_group[name], out_worker[name]), name
    rollout = with_advantages(out_worker)
    assert torch.equal(
        group.compute_log_prob(rollout)["old_log_probs"], worker.compute_log_prob(rollout)["old_log_probs"]
    )
    assert torch.equal(
        group.compute_ref_log_prob(rollout)["ref_log_prob"],
        worker.compute_ref_log_prob(rollout)["ref_log_prob"],
    )
    metrics = group.update_actor(rollout, policy_gradient_loss, UpdateRequest(mini_batch_size=3))
    expected = worker.update_actor(rollout, policy_gradient_loss, UpdateRequest(mini_batch_size=3))
    assert metrics["pg_loss"] == expected["pg_loss"] and metrics["grad_norm"] == expected["grad_norm"]
    assert group.sync_weights().version == worker.sync_weights().version == 1 == group.weight_version
    assert group.controller_bytes() == {"controller/sent_bytes": 0.0, "controller/received_bytes": 0.0}


def test_two_ranks_score_each_row_as_one_rank_and_keep_row_order(spec):
    """7 rows over 2 ranks (one pad row): each rank scores a balanced share; gathered, they are the
    single worker's log-probs row by row."""
    workers = [PolicyWorker(spec) for _ in range(2)]
    workers[1].rollout.replica_id = 1  # a router tells its replicas apart by id
    group = PolicyWorkerGroup(
        InProcessRanks("actor", workers), RolloutReplicas([w.rollout for w in workers], pad_token_id=0)
    )
    single = PolicyWorker(spec)
    rollout = single.generate(prompts(7, seed=5), SAMPLING, seed=0)
    torch.testing.assert_close(
        group.compute_log_prob(rollout)["old_log_probs"], single.compute_log_prob(rollout)["old_log_probs"]
    )
    generated = group.generate(prompts(7, seed=5), SAMPLING, seed=0)
    assert torch.equal(generated["prompts"], rollout["prompts"])  # row i answers prompt i


def test_an_in_process_failure_names_role_rank_and_phase(spec):
    plain = dataclasses.replace(spec, reference=None)
    group = PolicyWorkerGroup.in_process(plain)
    rollout = group.generate(prompts(2), SAMPLING, seed=0)
    with pytest.raises(RuntimeError, match="without a reference model") as caught:
        group.compute_ref_log_prob(rollout)
    assert "in actor rank 0, phase 'reference.log_prob'" in caught.value.__notes__


def test_worker_error_lists_every_failed_rank():
    error = WorkerError("actor", "actor.update", {1: "died (killed)", 0: "raised RuntimeError: gloo"})
    assert error.ranks == [0, 1]
    assert str(error) == (
        "actor worker group failed in phase 'actor.update': "
        "rank 0 raised RuntimeError: gloo; rank 1 died (killed)"
    )
