"""PrefixStore: exact prompt hits, session prefixes that the new prompt extends, LRU eviction by tokens."""

import torch

from stratarl.rollout.prefix_store import Prefix, PrefixStore


def prefix(tokens, logits=True) -> Prefix:
    kv = [(torch.zeros(1, 1, len(tokens), 1), torch.zeros(1, 1, len(tokens), 1))]
    return Prefix(tuple(tokens), kv, torch.zeros(4) if logits else None)


def test_prompt_hit_and_session_extension_rules():
    store = PrefixStore(max_tokens=100)
    store.put_prompt(prefix([1, 2, 3]))
    store.put_session("s", prefix([1, 2], logits=False))
    assert store.lookup((1, 2, 3), None).tokens == (1, 2, 3)  # exact prompt, any session
    assert store.lookup((1, 2, 9), "s").tokens == (1, 2)  # the session's tokens are a proper prefix
    assert store.lookup((1, 2, 9), None) is None
    assert store.lookup((1, 2), "s") is None  # not a proper prefix: nothing new to feed
    assert store.lookup((7, 2, 9), "s") is None  # diverged from the session's history
    assert store.lookup((1, 2, 9), "other") is None


def test_least_recently_used_entries_leave_first_when_over_budget():
    store = PrefixStore(max_tokens=6)
    store.put_prompt(prefix([1, 1]))
    store.put_prompt(prefix([2, 2]))
    store.lookup((1, 1), None)  # touch: (2, 2) is now the oldest
    store.put_prompt(prefix([3, 3, 3]))  # 2 + 2 + 3 = 7 > 6: evict (2, 2)
    assert store.lookup((2, 2), None) is None
    assert store.lookup((1, 1), None) is not None and store.lookup((3, 3, 3), None) is not None
    store.put_prompt(prefix(range(7)))  # longer than the whole budget: not stored
    assert len(store) == 2
    store.clear()
    assert len(store) == 0 and PrefixStore(0).lookup((1,), None) is None
