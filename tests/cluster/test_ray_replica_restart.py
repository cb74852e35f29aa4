"""Split plan on Ray with rollout.max_replica_restarts=1: a replica SIGKILLed between two calls is
started again on its bundle serving the pushed version, and the batch it then serves is the batch the
lost replica gave for the same seeds; a second loss stops with the named error and the count."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

ray = pytest.importorskip("ray")

from stratarl.cluster.placement import WorkerSizes, make_plan  # noqa: E402
from stratarl.cluster.ranks import WorkerError  # noqa: E402
from stratarl.cluster.ray_cluster import start_or_join  # noqa: E402
from stratarl.cluster.ray_policy_group import start_policy_group  # noqa: E402
from stratarl.engine.requests import UpdateRequest  # noqa: E402
from tests.cluster.test_ray_training import SAMPLING, spec  # noqa: E402, F401
from tests.cluster.test_worker_group import prompts, with_advantages  # noqa: E402
from tests.engine.tiny_batches import policy_gradient_loss  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _pid(process) -> int:
    return os.getpid()


def kill(replica) -> int:
    """SIGKILL the replica's process and wait until it is gone."""
    pid = ray.get(replica.actor.__ray_call__.remote(_pid))
    os.kill(pid, signal.SIGKILL)
    for _ in range(200):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        time.sleep(0.05)
    raise AssertionError(f"replica process {pid} still alive")


def test_a_killed_replica_is_started_again_with_the_served_weights_then_the_limit_stops(spec):  # noqa: F811
    os.environ.pop("RAY_ADDRESS", None)
    session = start_or_join(None, num_cpus=2)
    # 2 training ranks and 2 replicas of half a CPU each = the cluster's 2 CPUs
    sizes = WorkerSizes(
        training_workers=2, rollout_replicas=2, cpus_per_training_worker=0.5, cpus_per_rollout_replica=0.5
    )
    group = start_policy_group(spec, make_plan("split", sizes), call_timeout_s=120, max_replica_restarts=1)
    try:
        first = group.generate(prompts(8, seed=1), SAMPLING, seed=0)
        group.update_actor(with_advantages(first), policy_gradient_loss, UpdateRequest(mini_batch_size=4))
        group.sync_weights()  # version 1: what a restarted replica must be given
        expected = group.materialize(group.generate(prompts(8, seed=2), SAMPLING, seed=3))
        assert set(expected.non_tensor_batch["replica_id"]) == {0, 1}

        lost_pid = kill(group.engines.targets[1])
        got = group.materialize(group.generate(prompts(8, seed=2), SAMPLING, seed=3))
        (restart,) = group.take_replica_restarts()
        assert (restart.replica_id, restart.cause, restart.number, restart.weight_version) == (
            1,
            "died",
            1,
            1,
        )
        new_pid = ray.get(group.engines.targets[1].actor.__ray_call__.remote(_pid))
        assert new_pid != lost_pid and group.weight_version == 1
        assert torch.equal(got["responses"], expected["responses"])
        torch.testing.assert_close(
            got["rollout_log_probs"], expected["rollout_log_probs"], atol=1e-5, rtol=1e-5
        )
        assert got["weight_version"].tolist() == [1] * 8

        kill(group.engines.targets[0])
        with pytest.raises(
            WorkerError, match=r"1 of 1 restarts \(rollout.max_replica_restarts\) used"
        ) as caught:
            group.generate(prompts(8, seed=2), SAMPLING, seed=3)
        assert caught.value.role == "rollout" and caught.value.ranks == [0]
        assert "died" in str(caught.value)
    finally:
        group.shutdown()
        session.shutdown()
