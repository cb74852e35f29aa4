"""Per-row attention on packed inputs equals each row alone, and leaves padded or cached inputs to SDPA."""

import copy

import torch
from transformers import MistralConfig, MistralForCausalLM

from stratarl.engine.varlen_attention import NAME, row_bounds, use_varlen_attention, varlen_kwargs
from tests.engine.tiny_batches import tiny_model

LENGTHS = [3, 5, 2]


def packed_rows(seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(1, 32, (n,), generator=g) for n in LENGTHS]
    positions = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    return rows, torch.cat(rows)[None], positions


def test_row_bounds_from_the_keywords_or_from_restarting_positions():
    _, ids, positions = packed_rows()
    query = torch.zeros(1, 2, ids.shape[1], 4)
    kwargs = varlen_kwargs(torch.tensor([3, 0, 5, 2]))  # an empty row is dropped
    assert kwargs["cu_seq_lens_q"].tolist() == [0, 3, 8, 10] and kwargs["max_length_q"] == 5
    assert row_bounds(query, kwargs) == [0, 3, 8, 10]
    assert row_bounds(query, {"position_ids": positions}) == [0, 3, 8, 10]
    assert row_bounds(query, {"position_ids": torch.arange(10)[None]}) == [0, 10]  # one row
    assert row_bounds(torch.zeros(2, 2, 5, 4), {"position_ids": torch.arange(5)[None]}) == [0, 5]  # [b, L]


def test_packed_rows_attend_only_within_themselves():
    model = tiny_model(layers=2).eval()
    reference = copy.deepcopy(model)  # transformers' SDPA: the block-diagonal L×L mask
    use_varlen_attention(model)
    assert model.config._attn_implementation == NAME
    rows, ids, positions = packed_rows()
    with torch.no_grad():
        ours = model(input_ids=ids, position_ids=positions, **varlen_kwargs(torch.tensor(LENGTHS))).logits[0]
        inferred = model(input_ids=ids, position_ids=positions).logits[0]  # bounds from the positions
        masked = reference(input_ids=ids, position_ids=positions, use_cache=False).logits[0]
        alone = torch.cat([reference(input_ids=row[None]).logits[0] for row in rows])
    torch.testing.assert_close(ours, alone, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(inferred, ours, atol=0, rtol=0)
    torch.testing.assert_close(masked, alone, atol=1e-5, rtol=1e-5)


def test_packed_rows_of_a_sliding_window_model_keep_to_their_window():
    config = MistralConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, sliding_window=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = MistralForCausalLM(config).eval()
    reference = copy.deepcopy(model)  # transformers' SDPA with its sliding-window masks
    use_varlen_attention(model)
    rows, ids, positions = packed_rows()
    with torch.no_grad():
        ours = model(input_ids=ids, position_ids=positions, **varlen_kwargs(torch.tensor(LENGTHS))).logits[0]
        alone = torch.cat([reference(input_ids=row[None]).logits[0] for row in rows])
        reference.config.sliding_window = None  # the same rows without the window differ
        unwindowed = torch.cat([reference(input_ids=row[None]).logits[0] for row in rows])
    torch.testing.assert_close(ours, alone, atol=1e-5, rtol=1e-5)
    assert (unwindowed - alone).abs().max() > 1e-3


def test_padded_batches_and_cached_decoding_are_unchanged():
    model = tiny_model(layers=2).eval()
    reference = copy.deepcopy(model)
    use_varlen_attention(model)
    ids = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    with torch.no_grad():
        torch.testing.assert_close(
            model(input_ids=ids, attention_mask=mask).logits * mask[..., None],
            reference(input_ids=ids, attention_mask=mask).logits * mask[..., None],
        )
        out = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
        expected = reference.generate(
            ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0
        )
    assert torch.equal(out, expected)
