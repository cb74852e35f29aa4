"""Layer 5, rollout: KV prefixes kept between requests, so a prompt is prefilled once.

Two kinds of entry, evicted together least-recently-used when their tokens exceed a budget:

- a **prompt** entry: the KV of a whole prompt and the logits at its last position. The n samples of
  a prompt (GRPO's group) then cost one prefill even when they arrive separately;
- a **session** entry: the KV of a finished turn (its prompt and all response tokens but the last,
  which was never fed). The session's next turn, whose prompt extends those tokens, prefills only
  the tokens after them.

Entries hold the weights of one version: the engine clears the store when it loads new weights.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from torch import Tensor

from stratarl.rollout.kv_cache import KV


@dataclass(frozen=True)
class Prefix:
    """Cached KV of `tokens` (each layer's K/V [1, H, len(tokens), D]); logits [V] after the last
    token when known (prompt entries), else None (session entries: the next turn adds tokens)."""

    tokens: tuple[int, ...]
    kv: KV
    logits: Tensor | None


class PrefixStore:
    """An LRU of prompt and session prefixes holding at most `max_tokens` tokens in all (0 = off)."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[str, object], Prefix] = OrderedDict()
        self._tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, prompt: tuple[int, ...], session_id: str | None) -> Prefix | None:
        """The prompt's own entry, else the session's entry if its tokens are a proper prefix."""
        found = self._touch(("prompt", prompt))
        if found is not None:
            return found
        if session_id is None:
            return None
        entry = self._touch(("session", session_id))
        if (
            entry is not None
            and len(entry.tokens) < len(prompt)
            and prompt[: len(entry.tokens)] == entry.tokens
        ):
            return entry
        return None

    def put_prompt(self, prefix: Prefix) -> None:
        self._put(("prompt", prefix.tokens), prefix)

    def put_session(self, session_id: str, prefix: Prefix) -> None:
        self._put(("session", session_id), prefix)

    @property
    def num_bytes(self) -> int:
        """Bytes of the KV (and logits) the entries hold."""
        return sum(
            sum(t.numel() * t.element_size() for layer in entry.kv for t in layer)
            + (0 if entry.logits is None else entry.logits.numel() * entry.logits.element_size())
            for entry in self._entries.values()
        )

    def clear(self) -> None:
        self._entries.clear()
        self._tokens = 0

    def _touch(self, key: tuple[str, object]) -> Prefix | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def _put(self, key: tuple[str, object], prefix: Prefix) -> None:
        if len(prefix.tokens) > self.max_tokens:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self._tokens -= len(old.tokens)
        self._entries[key] = prefix
        self._tokens += len(prefix.tokens)
        while self._tokens > self.max_tokens:
            _, evicted = self._entries.popitem(last=False)
            self._tokens -= len(evicted.tokens)
