"""Prompt sampler: seeded epochs are permutations, and resume is exact mid-epoch and at an epoch boundary."""

import pytest

from stratarl.data.sampler import PromptSampler


def _draw(sampler, steps):
    return [sampler.next_batch() for _ in range(steps)]


def _flat(batches):
    return [index for batch in batches for index in batch]


def test_each_epoch_is_a_seeded_permutation():
    sampler = PromptSampler(10, batch_size=5, seed=1)
    assert sampler.batches_per_epoch == 2
    epoch0 = _flat(_draw(sampler, 2))
    epoch1 = _flat(_draw(sampler, 2))
    assert sorted(epoch0) == sorted(epoch1) == list(range(10))
    assert epoch0 != epoch1  # a new order each epoch
    again = PromptSampler(10, batch_size=5, seed=1)
    assert _flat(_draw(again, 4)) == epoch0 + epoch1
    other = PromptSampler(10, batch_size=5, seed=2)
    assert _flat(_draw(other, 2)) != epoch0


def test_drop_last_and_partial_last_batch():
    # 7 prompts, B=3: drop_last -> 2 batches of 3 (one prompt skipped per epoch); else 3 batches (3, 3, 1).
    dropped = PromptSampler(7, batch_size=3, seed=0)
    assert dropped.batches_per_epoch == 2 and [len(b) for b in _draw(dropped, 4)] == [3, 3, 3, 3]
    kept = PromptSampler(7, batch_size=3, seed=0, drop_last=False)
    batches = _draw(kept, 3)
    assert [len(b) for b in batches] == [3, 3, 1] and sorted(_flat(batches)) == list(range(7))
    assert kept.epoch == 1


def test_no_shuffle_is_in_order():
    sampler = PromptSampler(4, batch_size=2, seed=0, shuffle=False)
    assert _draw(sampler, 3) == [[0, 1], [2, 3], [0, 1]]


@pytest.mark.parametrize(
    "stop_after", [1, 2, 3, 5, 6, 9]
)  # 3 batches per epoch: 3, 6, 9 are epoch boundaries
def test_resume_continues_exactly(stop_after):
    reference = _draw(PromptSampler(12, batch_size=4, seed=5), 12)
    first = PromptSampler(12, batch_size=4, seed=5)
    _draw(first, stop_after)
    state = first.state_dict()
    resumed = PromptSampler(12, batch_size=4, seed=5)
    resumed.load_state_dict(state)
    rest = _draw(resumed, 12 - stop_after)
    assert all(len(batch) == 4 for batch in rest)  # never an empty epoch after the boundary
    assert rest == reference[stop_after:]


def test_state_at_an_epoch_boundary_points_at_the_next_epoch():
    sampler = PromptSampler(8, batch_size=4, seed=0)
    _draw(sampler, 2)  # the whole of epoch 0
    assert sampler.state_dict()["epoch"] == 1 and sampler.state_dict()["batch_in_epoch"] == 0
    # A state written as "epoch 0 exhausted" (verl #7401's shape) also resumes with all of epoch 1.
    exhausted = {**sampler.state_dict(), "epoch": 0, "batch_in_epoch": 2}
    resumed = PromptSampler(8, batch_size=4, seed=0)
    resumed.load_state_dict(exhausted)
    assert _flat(_draw(resumed, 2)) == list(resumed.epoch_order(1))
    assert sorted(resumed.epoch_order(1)) == list(range(8))


def test_state_from_a_different_sampler_is_refused():
    state = PromptSampler(8, batch_size=4, seed=0).state_dict()
    with pytest.raises(ValueError, match="num_items=8"):
        PromptSampler(9, batch_size=4, seed=0).load_state_dict(state)
    with pytest.raises(ValueError, match="seed=0"):
        PromptSampler(8, batch_size=4, seed=1).load_state_dict(state)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="cannot fill one batch"):
        PromptSampler(3, batch_size=4, seed=0)
    with pytest.raises(ValueError, match="empty"):
        PromptSampler(0, batch_size=1, seed=0)


def test_unused_per_epoch_counts_the_prompts_drop_last_leaves_out():
    sampler = PromptSampler(10, batch_size=4, seed=0, shuffle=False)
    seen = {i for _ in range(sampler.batches_per_epoch) for i in sampler.next_batch()}
    assert sampler.unused_per_epoch == 10 - len(seen) == 2  # rows 8 and 9, every epoch (no shuffle)
    assert PromptSampler(10, batch_size=4, seed=0, drop_last=False).unused_per_epoch == 0
