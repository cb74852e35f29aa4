"""Prompt collation: left padding, mask and position ids (against a plain loop), object columns."""

import numpy as np
import pytest
import torch

from stratarl.data.collate import collate_prompts, left_pad, position_ids_from_mask
from stratarl.data.prompt_dataset import PromptItem

PAD = 3


def _item(ids, row):
    return PromptItem(
        prompt_ids=ids,
        messages=[{"role": "user", "content": f"q{row}"}],
        data_source="arithmetic",
        ground_truth=str(row),
        ability="arithmetic",
        extra_info={"index": row},
        source_file="f.parquet",
        source_split="train",
        source_row=row,
    )


def test_left_padding_mask_and_positions_by_hand():
    # The pad id 3 also appears as a real token in row 0: the mask must come from lengths.
    batch = collate_prompts([_item([5, 3, 7], 0), _item([9], 1), _item([4, 4], 2)], pad_token_id=PAD)
    t = batch.tensors
    assert t["input_ids"].tolist() == [[5, 3, 7], [3, 3, 9], [3, 4, 4]]
    assert t["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1], [0, 1, 1]]
    assert t["position_ids"].tolist() == [[0, 1, 2], [0, 0, 0], [0, 0, 1]]
    assert all(v.dtype == torch.int64 for v in t.values()) and len(batch) == 3


def test_positions_match_a_plain_loop():
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(0, 9, (6,), generator=gen).tolist()
    mask = left_pad([[1] * n for n in lengths], pad_token_id=0, pad_to=10)
    positions = position_ids_from_mask(mask)
    for row, n in enumerate(lengths):
        expected = [0] * (10 - n) + list(range(n))
        assert positions[row].tolist() == expected


def test_pad_to_fixes_the_width_and_refuses_too_short():
    items = [_item([1, 2], 0), _item([1], 1)]
    assert collate_prompts(items, pad_token_id=PAD, pad_to=5).tensors["input_ids"].shape == (2, 5)
    with pytest.raises(ValueError, match="pad_to=1"):
        collate_prompts(items, pad_token_id=PAD, pad_to=1)


def test_non_tensor_columns_are_one_dimensional_object_arrays():
    # Equal-length id lists would become a 2-D int array with np.array(); they must stay [B] objects.
    batch = collate_prompts([_item([1, 2], 0), _item([3, 4], 1)], pad_token_id=PAD)
    for key, column in batch.non_tensors.items():
        assert column.dtype == object and column.shape == (2,), key
    assert batch.non_tensors["raw_prompt_ids"][1] == [3, 4]
    assert batch.non_tensors["raw_prompt"][0] == [{"role": "user", "content": "q0"}]
    assert list(batch.non_tensors["source_row"]) == [0, 1]
    assert list(batch.non_tensors["ground_truth"]) == ["0", "1"]
    assert isinstance(batch.non_tensors["extra_info"], np.ndarray)
