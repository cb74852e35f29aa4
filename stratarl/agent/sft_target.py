"""Layer 5, agent loops: a multi-turn SFT demonstration as token ids with a loss mask, laid out
exactly as the tool loop lays out a rollout.

Assistant messages are tokenized from their text and closed with EOS (mask 1: the model learns to
write them); tool and user messages in between are rendered by `ChatRenderer.observation_ids`
(mask 0: the model reads them but is not trained to predict a tool's output). So an SFT target and
an RL response share one token layout, and SFT never teaches the model to hallucinate tool results.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stratarl.agent.rendering import ChatRenderer, encode


def sft_target_ids(renderer: ChatRenderer, messages: Sequence[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of the continuation `messages` (extra_info["answer_messages"]), which must start
    and end with an assistant message."""
    if not messages or messages[0].get("role") != "assistant" or messages[-1].get("role") != "assistant":
        raise ValueError("an SFT continuation must start and end with an assistant message")
    ids: list[int] = []
    mask: list[int] = []
    pending: list[dict[str, Any]] = []
    for message in messages:
        if message["role"] != "assistant":
            pending.append(dict(message))
            continue
        if pending:
            observation = renderer.observation_ids(pending)
            ids += observation
            mask += [0] * len(observation)
            pending = []
        turn = [*encode(renderer.tokenizer, str(message["content"])), renderer.eos_token_id]
        ids += turn
        mask += [1] * len(turn)
    return ids, mask
