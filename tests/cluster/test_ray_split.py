"""Split plan on Ray: a replica gets rank 0's weights in buckets, not via the controller; a hang is named."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

ray = pytest.importorskip("ray")

from stratarl.cluster.placement import WorkerSizes, make_plan  # noqa: E402
from stratarl.cluster.policy_worker import PolicyWorker  # noqa: E402
from stratarl.cluster.ranks import WorkerError  # noqa: E402
from stratarl.cluster.ray_cluster import start_or_join  # noqa: E402
from stratarl.cluster.ray_policy_group import start_policy_group  # noqa: E402
from stratarl.engine.requests import UpdateRequest  # noqa: E402
from tests.cluster.test_ray_training import SAMPLING, spec  # noqa: E402, F401
from tests.cluster.test_worker_group import prompts, with_advantages  # noqa: E402
from tests.engine.tiny_batches import policy_gradient_loss  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]
BUCKET_BYTES = 4096  # the tiny model's ~30 KB of weights travel in several buckets


@pytest.fixture(scope="module")
def group(spec):  # noqa: F811
    os.environ.pop("RAY_ADDRESS", None)
    session = start_or_join(None, num_cpus=2)
    # 2 training ranks of half a CPU each + 1 replica of one CPU = the cluster's 2 CPUs
    plan = make_plan("split", WorkerSizes(training_workers=2, cpus_per_training_worker=0.5))
    group = start_policy_group(spec, plan, call_timeout_s=120, bucket_bytes=BUCKET_BYTES)
    yield group
    group.shutdown()
    session.shutdown()


def test_replica_serves_the_trained_weights_after_a_bucketed_sync(group, spec):  # noqa: F811
    initial = PolicyWorker(spec)
    first = group.generate(prompts(8, seed=1), SAMPLING, seed=0)
    assert first["weight_version"].tolist() == [0] * 8
    group.update_actor(with_advantages(first), policy_gradient_loss, UpdateRequest(mini_batch_size=4))
    group.controller_bytes()  # reset: measure the sync alone
    report = group.sync_weights()
    sync_traffic = group.controller_bytes()
    model_bytes = sum(t.numel() * t.element_size() for t in initial.actor.model.state_dict().values())
    print(f"\nsync: {report}; controller bytes {sync_traffic}; model {model_bytes} bytes")
    assert report.version == 1 == group.weight_version and report.num_changed > 0
    assert sync_traffic["controller/sent_bytes"] + sync_traffic["controller/received_bytes"] < model_bytes / 4

    after = group.generate(prompts(8, seed=2), SAMPLING, seed=3)
    assert after["weight_version"].tolist() == [1] * 8
    mask = after["response_mask"].bool()
    trained = group.compute_log_prob(after)["old_log_probs"]
    # the replica sampled with the trained weights: its log-probs are the actor's, not the initial model's
    torch.testing.assert_close(after["rollout_log_probs"][mask], trained[mask], atol=1e-4, rtol=1e-4)
    untrained = initial.compute_log_prob(group.materialize(after))[
        "old_log_probs"
    ]  # one process: all columns
    assert (untrained[mask] - trained[mask]).abs().max() > 1e-3


def test_a_hung_replica_is_named_within_the_timeout(group):
    (replica,) = group.engines.targets
    replica.timeout_s = 3.0
    pid = ray.get(replica.actor.__ray_call__.remote(lambda self: os.getpid()))
    os.kill(pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(WorkerError) as caught:
            group.generate(prompts(2), SAMPLING, seed=0)
        elapsed = time.monotonic() - start
    finally:
        os.kill(pid, signal.SIGCONT)
    assert caught.value.role == "rollout" and caught.value.ranks == [0]
    assert "did not answer within 3 s" in str(caught.value) and "rollout.generate" in str(caught.value)
    assert elapsed < 10.0
