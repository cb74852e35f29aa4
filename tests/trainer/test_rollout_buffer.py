"""The async buffer under random producer and consumer speeds: no trained batch is ever staler than
async_training.max_staleness, the buffer never holds more than its bound, and dropped rows are counted;
also when pushes land in the batch being generated (partial rollout): its tokens then span versions,
and the bound holds for its oldest token, hence for every token."""

import random
import threading
import time

import pytest

from stratarl.trainer.rollout_buffer import BufferedBatch, ProducerFailed, RolloutBuffer

ROWS = 4


def run_pair(
    *,
    strategy,
    max_staleness,
    sync_interval,
    capacity,
    steps,
    seed,
    pinned=False,
    start_delay=0.0,
    partial=False,
):
    """A producer and a trainer thread at random speeds, the trainer pushing version p(j)+1 every
    `sync_interval` steps as the real one does; returns (staleness per step, buffer, max depth seen).
    partial: the push does not hold the producer (`advance`); the producer generates each batch in
    chunks of tokens, each with the version the rollout serves when it is sampled, and records the
    batch's oldest (as `AsyncBatches` does). The tokens' versions per trained step are `buffer.tokens`."""
    rng = random.Random(seed)
    producer_sleeps = [rng.choice([0.0, 0.0005, 0.002, 0.006]) for _ in range(4 * steps)]
    trainer_sleeps = [rng.choice([0.0, 0.0005, 0.002, 0.006]) for _ in range(steps)]
    version_of = lambda step: step - 1  # noqa: E731  step 1 trains version 0
    buffer = RolloutBuffer(
        capacity=capacity,
        max_staleness=max_staleness,
        strategy=strategy,
        version_of=version_of,
        rollout_version=0,
        next_step=1,
        pinned=pinned,
    )
    depths = []

    def produce():
        for sleep in producer_sleeps:
            time.sleep(sleep * start_delay)  # slow to pick up the next batch
            started = buffer.begin_produce()
            if started is None:
                return
            step, version = started
            tokens = []
            for _ in range(4):  # generating, a chunk of tokens at a time
                tokens.append(buffer.rollout_version)
                time.sleep(sleep / 4)
            assert version <= min(tokens) and tokens == sorted(tokens)
            assert partial or set(tokens) == {version}  # held: one version per batch
            buffer.end_produce(BufferedBatch(step, min(tokens), ROWS, tokens))
            depths.append(len(buffer.items))

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    staleness, buffer.tokens = [], []
    for step in range(1, steps + 1):
        batch, _ = buffer.take(step, timeout=30)
        staleness.append(version_of(step) - batch.version)
        buffer.tokens.append((version_of(step), batch.item))
        time.sleep(trainer_sleeps[step - 1])  # training
        if step % sync_interval == 0 and partial:
            buffer.advance(version_of(step) + 1)
        elif step % sync_interval == 0:
            buffer.hold(before_push=True)
            buffer.release(version_of(step) + 1)
    buffer.stop()
    producer.join(timeout=10)
    return staleness, buffer, max(depths)


@pytest.mark.parametrize("partial", [False, True], ids=["finish", "continue"])
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    ("strategy", "max_staleness", "sync_interval", "capacity"),
    [("wait", 0, 1, 2), ("wait", 1, 1, 3), ("wait", 2, 3, 4), ("drop", 1, 1, 3), ("drop", 3, 2, 6)],
)
def test_staleness_never_exceeds_the_bound(seed, strategy, max_staleness, sync_interval, capacity, partial):
    staleness, buffer, max_depth = run_pair(
        strategy=strategy,
        max_staleness=max_staleness,
        sync_interval=sync_interval,
        capacity=capacity,
        steps=25,
        seed=seed,
        partial=partial,
    )
    assert len(staleness) == 25
    assert max(staleness) <= max_staleness and min(staleness) >= 0
    for trained, tokens in buffer.tokens:  # every token: as old as the bound at most, never newer
        assert all(0 <= trained - v <= max_staleness for v in tokens), (trained, tokens)
    mixed = sum(len(set(tokens)) > 1 for _, tokens in buffer.tokens)
    assert mixed == 0 or partial
    if partial and sync_interval == 1 and max_staleness == 1:  # 9-18 of 25 batches in 6 seeds seen
        assert mixed > 0  # pushes did land mid-batch: the bound above held for them
    assert max_depth <= capacity
    assert buffer.counters.staleness_seen == staleness
    if strategy == "wait":  # pacing: nothing is generated that could not be trained
        assert buffer.counters.dropped_rows == 0
    assert buffer.counters.dropped_rows == ROWS * buffer.counters.dropped_batches


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    ("max_staleness", "sync_interval", "capacity"), [(1, 1, 1), (2, 1, 2), (3, 2, 2), (2, 3, 1)]
)
def test_a_pinned_schedule_gives_every_batch_the_same_version_whatever_the_speeds(
    seed, max_staleness, sync_interval, capacity
):
    staleness, buffer, _ = run_pair(
        strategy="wait",
        max_staleness=max_staleness,
        sync_interval=sync_interval,
        capacity=capacity,
        steps=25,
        seed=seed,
        pinned=True,
        start_delay=2.0,  # unpinned, a producer slow to start its next batch gets fresher weights
    )
    # batch L (trained at step L, policy version L − 1) comes from the oldest pushed version
    # ≥ L − 1 − S; the pushes are 0 and then every sync_interval steps
    pushed = [0] + [step for step in range(1, 26) if step % sync_interval == 0]
    expected = [(L - 1) - min(v for v in pushed if v >= L - 1 - max_staleness) for L in range(1, 26)]
    assert staleness == expected
    assert buffer.counters.dropped_rows == 0


def small_buffer(capacity, strategy):
    version_of = lambda s: s - 1  # noqa: E731
    return RolloutBuffer(
        capacity=capacity,
        max_staleness=1,
        strategy=strategy,
        version_of=version_of,
        rollout_version=0,
        next_step=1,
    )


def test_a_fast_producer_under_drop_runs_ahead_and_its_stale_batches_are_counted():
    # Version 0 fills the buffer (3 batches for steps 1-3); step 1 pushes version 1, so at step 3 the
    # batch generated with version 0 is 2 versions old: with max_staleness=1 it is dropped.
    buffer = small_buffer(3, "drop")
    for _ in range(3):
        step, version = buffer.begin_produce()
        buffer.end_produce(BufferedBatch(step, version, ROWS))
    assert [b.version for b in buffer.ready()] == [0, 0, 0]
    assert buffer.take(1)[0].step == 1
    buffer.hold()
    buffer.release(1)
    assert buffer.take(2)[0].step == 2  # staleness 1 - 0 = 1: kept
    step, version = buffer.begin_produce()  # room again: generated with version 1
    buffer.end_produce(BufferedBatch(step, version, ROWS))
    batch, depth = buffer.take(3)  # the batch of version 0 is 2 - 0 = 2 old: dropped
    assert (batch.version, depth) == (1, 1)
    assert (buffer.counters.dropped_batches, buffer.counters.dropped_rows) == (1, ROWS)


def test_wait_keeps_the_producer_from_running_past_the_bound():
    buffer = small_buffer(8, "wait")
    assert buffer.may_start(1) and buffer.may_start(2)  # versions 0, 1 of the policy: 0 is ≥ p − 1
    assert not buffer.may_start(3)  # step 3 trains version 2: version 0 would be 2 old
    buffer.release(1)
    assert buffer.may_start(3)


def test_a_failed_producer_is_raised_in_the_trainer():
    buffer = small_buffer(2, "wait")
    buffer.begin_produce()
    buffer.end_produce(None, ValueError("engine died"))
    with pytest.raises(ProducerFailed, match="engine died"):
        buffer.take(1, timeout=5)
