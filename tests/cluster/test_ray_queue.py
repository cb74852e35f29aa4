"""The TransferQueue data path on Ray: engines write the rows, ranks read and write them, the controller
holds references and response-aligned columns only — with results equal to one process."""

from __future__ import annotations

import os

import pytest
import torch

ray = pytest.importorskip("ray")

from stratarl.cluster.placement import WorkerSizes, make_plan  # noqa: E402
from stratarl.cluster.policy_worker import PolicyWorker  # noqa: E402
from stratarl.cluster.queue_rows import KEY  # noqa: E402
from stratarl.cluster.queue_shard import BULK_FIELDS  # noqa: E402
from stratarl.cluster.ray_cluster import start_or_join  # noqa: E402
from stratarl.cluster.ray_policy_group import start_policy_group  # noqa: E402
from stratarl.cluster.ray_ranks import wire_bytes  # noqa: E402
from stratarl.engine.requests import ScoreRequest, UpdateRequest  # noqa: E402
from stratarl.transport.field_checks import validate  # noqa: E402
from stratarl.transport.kv_meta import KVBatchMeta  # noqa: E402
from tests.cluster.test_ray_training import SAMPLING, spec  # noqa: E402,F401  (module fixture)
from tests.cluster.test_worker_group import prompts, with_advantages  # noqa: E402
from tests.engine.tiny_batches import policy_gradient_loss  # noqa: E402

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def group(spec):  # noqa: F811
    os.environ.pop("RAY_ADDRESS", None)
    session = start_or_join(None, num_cpus=2)
    group = start_policy_group(
        spec, make_plan("colocated", WorkerSizes(training_workers=2)), call_timeout_s=120
    )
    yield group
    group.shutdown()
    session.shutdown()


def test_generation_writes_the_bulk_columns_to_the_queue_not_to_the_controller(group, spec):  # noqa: F811
    group.controller_bytes()
    batch = group.generate(prompts(7, seed=5), SAMPLING, seed=3)
    traffic = group.controller_bytes()
    assert KEY in batch and not any(name in batch for name in BULK_FIELDS)
    validate(batch, writes=["prompts", "input_ids", "position_ids", "responses"], phase="rollout")
    single = PolicyWorker(spec).generate(prompts(7, seed=5), SAMPLING, seed=3)
    full = group.materialize(batch)
    for name in ("prompts", "input_ids", "position_ids", "attention_mask", "responses", "response_mask"):
        assert torch.equal(full[name], single[name]), name  # the layout one engine makes
    bulk = sum(single[name].numel() * 8 for name in BULK_FIELDS)
    print(f"\ngenerate: controller {traffic}, bulk columns left in the queue: {bulk} B")
    # what came back is the response-aligned columns, a little less than the whole layout
    assert traffic["controller/received_bytes"] < wire_bytes(single)


def test_scoring_and_update_through_the_queue_equal_one_process(group, spec):  # noqa: F811
    batch = group.generate(prompts(8, seed=2), SAMPLING, seed=1)
    single = PolicyWorker(spec)
    full = group.materialize(batch)
    group.controller_bytes()
    scored = group.compute_log_prob(batch, ScoreRequest(with_entropy=True))
    scoring_traffic = group.controller_bytes()
    expected = single.compute_log_prob(full, ScoreRequest(with_entropy=True))
    torch.testing.assert_close(scored["old_log_probs"], expected["old_log_probs"], atol=2e-5, rtol=1e-5)
    assert scoring_traffic["controller/sent_bytes"] < 4_000  # four shard references, no rows
    stored = group.path.queue.get(KVBatchMeta(group.path.partition, list(batch[KEY]), {}), ["old_log_probs"])
    assert torch.equal(stored["old_log_probs"], scored["old_log_probs"])  # the ranks wrote them
    trained = with_advantages(batch.union(scored))
    by_4 = UpdateRequest(mini_batch_size=4)
    one = single.update_actor(with_advantages(full.union(scored)), policy_gradient_loss, by_4)
    two = group.update_actor(trained, policy_gradient_loss, by_4)
    update_traffic = group.controller_bytes()
    assert two["pg_loss"] == pytest.approx(one["pg_loss"], rel=1e-5, abs=1e-7)
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    # only what the controller computed (advantages) went out, not the rows the ranks read
    assert update_traffic["controller/sent_bytes"] < trained["advantages"].numel() * 4 + 8_000
    print(f"\nscoring: {scoring_traffic}; update: {update_traffic}")
    group.clear_queue()
    assert group.path.queue.stored_bytes() == 0
