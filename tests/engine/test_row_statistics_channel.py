"""The update's per-row statistics channel: the engine collects `loss_fn.row_statistics` under each
row's `row_id` through shuffling, mini-batches, epochs and pad rows, and the worker group gathers them."""

import torch

from stratarl.cluster.dispatch import DirectDispatch
from stratarl.cluster.ranks import InProcessRanks
from stratarl.engine.actor import Actor, OptimizerSettings
from stratarl.engine.requests import UpdateRequest
from stratarl.objective.actor_loss import ActorLoss
from stratarl.transport.data_proto import DataProto
from stratarl.transport.fields import ROW_ID
from tests.engine.tiny_batches import ragged_batch, tiny_model


def traced_batch(actor: Actor, n: int = 8) -> DataProto:
    batch = ragged_batch(n=n, seed=3)
    old, _ = actor.compute_log_prob(batch)
    ids = torch.arange(n, dtype=torch.int64) + 100  # not the row positions: the channel must key by id
    return batch.union(DataProto.from_dict({"old_log_probs": old, ROW_ID: ids}))


def test_first_mini_batch_sees_the_old_policy_later_ones_a_moved_one():
    actor = Actor(tiny_model(), optim=OptimizerSettings(lr=1e-2), micro_batch_size=2)
    batch = traced_batch(actor)
    actor.update(batch, ActorLoss(), UpdateRequest(mini_batch_size=4, epochs=1, shuffle_seed=None))
    stats = actor.last_row_statistics
    assert sorted(stats[ROW_ID].tolist()) == list(range(100, 108))  # every row exactly once
    by_id = {int(r): i for i, r in enumerate(stats[ROW_ID])}
    mask = batch["response_mask"].float()
    old_mean = (batch["old_log_probs"] * mask).sum(-1) / mask.sum(-1)
    for row in range(8):
        i = by_id[100 + row]
        assert stats["tokens"][i] == mask[row].sum()
        # the identity ties the engine's number to the controller's: a misaligned row would break it
        torch.testing.assert_close(stats["new_log_prob_mean"][i] - old_mean[row], stats["log_ratio_mean"][i])
        if row < 4:  # first mini-batch: forward before any optimizer step, π_θ = π_old
            torch.testing.assert_close(stats["ratio_mean"][i], torch.tensor(1.0), atol=1e-5, rtol=0)
    later = [
        stats["ratio_max"][by_id[100 + row]] - stats["ratio_min"][by_id[100 + row]] for row in range(4, 8)
    ]
    assert max(later) > 1e-4, "the second mini-batch should see the policy moved by the first step"


def test_without_row_ids_nothing_is_collected_and_pad_rows_are_dropped():
    actor = Actor(tiny_model(), optim=OptimizerSettings(lr=1e-3), micro_batch_size=4)
    batch = traced_batch(actor)
    untraced = batch.select([c for c in batch.columns if c != ROW_ID])
    actor.update(untraced, ActorLoss(), UpdateRequest(mini_batch_size=8))
    assert actor.last_row_statistics == {}
    zero_weight = batch["response_mask"] * (torch.arange(8) < 6)[:, None]
    padded = batch.select([c for c in batch.columns if c != "response_mask"])
    padded = padded.union(DataProto.from_dict({"response_mask": zero_weight}))
    twice = UpdateRequest(mini_batch_size=4, epochs=2, shuffle_seed=7)
    actor.update(padded, ActorLoss(), twice)  # rows 6, 7: zero weight
    assert sorted(actor.last_row_statistics[ROW_ID].tolist()) == list(range(100, 106))


class _Worker:
    """What `PolicyWorker.update_actor` and `update_row_statistics` read of a worker: its actor, and
    that no memory hand-off applies (a CPU worker without a rollout engine)."""

    frees_rollout_cache = offloads_optimizer = False
    released_bytes = 0

    def __init__(self, actor):
        self.actor = actor

    def release_rollout_cache(self) -> int:
        return 0


def test_a_worker_group_gathers_every_real_row_once_from_its_ranks():
    from stratarl.cluster.policy_worker import PolicyWorker
    from stratarl.cluster.worker_group import PolicyWorkerGroup

    workers = [
        _Worker(Actor(tiny_model(), optim=OptimizerSettings(lr=1e-3), micro_batch_size=2)) for _ in range(3)
    ]
    group = PolicyWorkerGroup.__new__(PolicyWorkerGroup)
    group.ranks, group.path = InProcessRanks("actor", workers), DirectDispatch()
    batch = traced_batch(workers[0].actor, n=8)  # 8 rows over 3 ranks: pad rows on some shares
    request = UpdateRequest(mini_batch_size=8)
    group.path.update(group.ranks, "actor.update", PolicyWorker.update_actor, batch, ActorLoss(), request)
    stats = group.update_row_statistics()
    assert sorted(stats[ROW_ID].tolist()) == list(range(100, 108))
