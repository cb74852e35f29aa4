"""Packed model inputs: which position scores which token, padding computed, packed == padded log-probs."""

import pytest
import torch

from stratarl.engine.actor import compute_log_probs
from stratarl.engine.packing import pack_rows, pad_rows, padding_share
from tests.engine.tiny_batches import ragged_batch, tiny_model


def two_rows():
    # row 0: prompt [_, 5, 6] response [7, 8, _]; row 1: prompt [9, 4, 3] response [2, _, _]  (_ = pad 0)
    input_ids = torch.tensor([[0, 5, 6, 7, 8, 0], [9, 4, 3, 2, 0, 0]])
    attention_mask = torch.tensor([[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]])
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


def test_pack_concatenates_real_tokens_and_points_each_token_at_its_predecessor():
    inputs = pack_rows(*two_rows(), response_len=3)
    assert inputs.input_ids.tolist() == [[5, 6, 7, 8, 9, 4, 3, 2]]
    assert inputs.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3]]
    assert inputs.attention_mask is None
    # tokens 7, 8 (row 0) are predicted at packed slots 1 (token 6) and 2 (token 7); token 2 (row 1) at 6
    assert inputs.score_index.tolist() == [1, 2, 6] and inputs.labels.tolist() == [7, 8, 2]
    assert inputs.rows.tolist() == [0, 0, 1] and inputs.cols.tolist() == [0, 1, 0]
    assert inputs.computed_tokens == inputs.real_tokens == 8


def test_pad_keeps_the_layout_and_counts_its_padding():
    inputs = pad_rows(*two_rows(), response_len=3)
    # flat positions in the 2×6 grid: row 0 cols 2, 3; row 1 col 2 → 6 + 2 = 8
    assert inputs.score_index.tolist() == [2, 3, 8] and inputs.labels.tolist() == [7, 8, 2]
    assert inputs.computed_tokens == 12 and inputs.real_tokens == 8
    assert padding_share(inputs.computed_tokens, inputs.real_tokens) == pytest.approx(4 / 12)


def test_scores_land_in_the_response_grid_with_zeros_elsewhere():
    inputs = pack_rows(*two_rows(), response_len=3)
    grid = inputs.to_grid(torch.tensor([1.0, 2.0, 3.0]))
    assert grid.tolist() == [[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]]


def test_packing_rejects_positions_that_do_not_restart_at_zero():
    input_ids, attention_mask, position_ids = two_rows()
    with pytest.raises(ValueError, match="start at 0"):
        pack_rows(input_ids, attention_mask, position_ids + 1, response_len=3)


def test_packed_log_probs_and_entropy_equal_the_padded_forward():
    # Tolerance 1e-5 (fp32): the block-diagonal mask gives the same math, summed in another order.
    model, batch = tiny_model(layers=2), ragged_batch(n=10, seed=4)
    kwargs = dict(micro_batch_size=4, temperature=0.8, with_entropy=True)
    packed = compute_log_probs(model, batch, layout="packed", **kwargs)
    padded = compute_log_probs(model, batch, layout="padded", logit_chunk_size=None, **kwargs)
    for a, b in zip(packed, padded, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert (packed[0] != 0).sum() == batch["response_mask"].sum()  # every response token scored


def test_ragged_batch_padding_share_before_and_after_packing():
    batch = ragged_batch(n=16, seed=5, prompt_len=12, response_len=10)
    rows = (batch["input_ids"], batch["attention_mask"], batch["position_ids"], 10)
    padded, packed = pad_rows(*rows), pack_rows(*rows)
    real = int(batch["attention_mask"].sum())
    assert padded.computed_tokens == 16 * 22 and padded.real_tokens == real == packed.computed_tokens
    assert padding_share(padded.computed_tokens, padded.real_tokens) == pytest.approx(1 - real / 352)
    assert padding_share(packed.computed_tokens, packed.real_tokens) == 0.0
