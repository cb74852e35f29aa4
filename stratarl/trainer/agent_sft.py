"""Layer 2, control flow: SFT on multi-turn demonstrations — tool results in context, out of the loss.

A demonstration is the row's `extra_info["answer_messages"]` (e.g. assistant tool call, tool
result, assistant answer). `stratarl.agent.sft_target.sft_target_ids` lays it out exactly as the
agent loop lays out a rollout: assistant turns closed with EOS get loss mask 1; the tool result and
the template text around it get 0 (read, never predicted), so SFT teaches the model to call the tool
and to use its result, not to invent one. A row without `answer_messages` falls back to its
`extra_info["answer"]` as one assistant message. The loss and the loop are `sft.py`'s:

    run_sft(worker, dataset, tokenizer, ..., make_batch=agent_sft_batch)
"""

from __future__ import annotations

from typing import Any

from stratarl.agent.rendering import ChatRenderer
from stratarl.agent.sft_target import sft_target_ids
from stratarl.data.prompt_dataset import PromptDataset, PromptItem
from stratarl.trainer.sft import reference_response, sft_examples
from stratarl.transport.data_proto import DataProto


def demonstration_messages(item: PromptItem) -> list[dict[str, Any]]:
    """The reference continuation of a row as chat messages (first and last: assistant)."""
    messages = (item.extra_info or {}).get("answer_messages")
    if messages is None:
        return [{"role": "assistant", "content": reference_response(item)}]
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise ValueError(
            f"{item.source_file} row {item.source_row}: extra_info['answer_messages'] must be a list of "
            "chat messages with role and content"
        )
    # Parquet structs give every message every field of the column; drop the null fillers.
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


def agent_sft_batch(
    dataset: PromptDataset, indices: list[int], tokenizer: Any, *, renderer: ChatRenderer | None = None
) -> DataProto:
    """Prompt ++ demonstration in the batch-edge layout; `response_mask` is the loss mask."""
    renderer = renderer or ChatRenderer(tokenizer)
    items = [dataset[i] for i in indices]
    targets, masks = [], []
    for item in items:
        try:
            ids, mask = sft_target_ids(renderer, demonstration_messages(item))
        except ValueError as err:
            raise ValueError(f"{item.source_file} row {item.source_row}: {err}") from err
        targets.append(ids)
        masks.append(mask)
    return sft_examples(items, targets, tokenizer.pad_token_id, masks=masks)
