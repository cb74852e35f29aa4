"""Layer 5, agent gateway: a chat prompt that continues an earlier call keeps that call's ids.

An untrained model often samples a spelling of its text the tokenizer would not write (`c`,`a`,`l`
where it writes `calc`). When the agent sends that answer back, rendering the chat and tokenizing it
gives the canonical ids, the prompt no longer begins with the earlier call's prompt + sampled ids,
and the episode splits into one row per call (`episode_rows`). `continue_sampled` instead keeps the
ids the engine saw and sampled for the text they decode to, and tokenizes only the rest:

    text(prompt) = decode(prev.prompt_ids + prev.response_ids) + rest
    ids(prompt)  = prev.prompt_ids + prev.response_ids + encode(rest)

It applies only when the rendered prompt text begins with the earlier call's decoded text exactly,
and the ids it returns decode to exactly the rendered text (the model reads the same characters,
as the ids it produced them with); otherwise the canonical ids stand.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stratarl.agent.gateway.capture import CallRecord
from stratarl.agent.rendering import encode


def decode_exact(tokenizer: Any, ids: Sequence[int]) -> str:
    """The text of `ids`, special tokens kept, no clean-up of spaces."""
    return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def continue_sampled(tokenizer: Any, prompt_text: str, calls: Sequence[CallRecord]) -> list[int] | None:
    """The prompt ids of `prompt_text` that begin with the latest of `calls` whose prompt + sampled
    ids decode to a prefix of it, the rest tokenized; None when no call's text is a prefix, or
    when the joined ids would not decode to `prompt_text` exactly."""
    for previous in reversed(calls):
        prefix = decode_exact(tokenizer, previous.sequence)
        if not prompt_text.startswith(prefix):
            continue
        ids = [*previous.sequence, *encode(tokenizer, prompt_text[len(prefix) :])]
        return ids if decode_exact(tokenizer, ids) == prompt_text else None
    return None
