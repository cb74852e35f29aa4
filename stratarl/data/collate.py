"""Layer 5, data: collate B `PromptItem`s into left-padded prompt tensors plus per-row lists.

Layout (verl's): prompts LEFT-padded to P so that every row's last prompt token sits at column
P-1 and generation appends on the right. position_ids = cumsum(attention_mask) - 1, clipped at 0.
The result is two plain dicts; the trainer wraps them into a DataProto.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from stratarl.data.prompt_dataset import PromptItem


@dataclass
class PromptBatch:
    """tensors: input_ids / attention_mask / position_ids, each [B, P] int64.
    non_tensors: [B] numpy object arrays — raw_prompt (messages), raw_prompt_ids (unpadded ids),
    data_source, ground_truth, ability, extra_info, source_file, source_split, source_row."""

    tensors: dict[str, Tensor]
    non_tensors: dict[str, np.ndarray]

    def __len__(self) -> int:
        return int(self.tensors["input_ids"].shape[0])


def left_pad(sequences: Sequence[Sequence[int]], *, pad_token_id: int, pad_to: int | None = None) -> Tensor:
    """[B, P] int64, each sequence right-aligned; P = pad_to or the longest sequence."""
    longest = max((len(seq) for seq in sequences), default=0)
    width = longest if pad_to is None else pad_to
    if width < longest:
        raise ValueError(f"pad_to={pad_to} is shorter than the longest prompt ({longest} tokens)")
    out = torch.full((len(sequences), width), pad_token_id, dtype=torch.int64)
    for row, seq in enumerate(sequences):
        if seq:
            out[row, width - len(seq) :] = torch.as_tensor(list(seq), dtype=torch.int64)
    return out


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """[B, L] positions counted over real tokens only: 0 at each row's first real token, 0 on padding."""
    return (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)


def collate_prompts(
    items: Sequence[PromptItem], *, pad_token_id: int, pad_to: int | None = None
) -> PromptBatch:
    """One batch of B prompts. The mask comes from lengths, never from pad ids (pad may be a real token)."""
    if not items:
        raise ValueError("collate_prompts needs at least one item")
    input_ids = left_pad([item.prompt_ids for item in items], pad_token_id=pad_token_id, pad_to=pad_to)
    lengths = torch.tensor([len(item.prompt_ids) for item in items])  # [B]
    width = input_ids.shape[1]
    attention_mask = (torch.arange(width).unsqueeze(0) >= (width - lengths).unsqueeze(1)).to(torch.int64)
    tensors = {
        "input_ids": input_ids,  # [B, P]
        "attention_mask": attention_mask,  # [B, P]
        "position_ids": position_ids_from_mask(attention_mask),  # [B, P]
    }
    columns: dict[str, list[Any]] = {
        "raw_prompt": [item.messages for item in items],
        "raw_prompt_ids": [list(item.prompt_ids) for item in items],
        "data_source": [item.data_source for item in items],
        "ground_truth": [item.ground_truth for item in items],
        "ability": [item.ability for item in items],
        "extra_info": [item.extra_info for item in items],
        "source_file": [item.source_file for item in items],
        "source_split": [item.source_split for item in items],
        "source_row": [item.source_row for item in items],
        "agent_name": [item.agent_name for item in items],
    }
    return PromptBatch(tensors, {key: _object_array(values) for key, values in columns.items()})


def _object_array(values: list[Any]) -> np.ndarray:
    """[B] dtype=object; filled element-wise so lists of equal length do not become a 2-D array."""
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out
