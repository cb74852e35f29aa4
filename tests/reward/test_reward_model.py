"""A sequence-classification reward model read at the last real token, whatever the padding."""

import torch
from transformers import Qwen2Config, Qwen2ForSequenceClassification

from stratarl.data.tokenizer_factory import train_tokenizer
from stratarl.reward.reward_model import SequenceRewardModel, last_token_index

VOCAB, PAD = 64, 3


def tiny_rm(pad_token_id=PAD, vocab=VOCAB):
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_labels=1,
        pad_token_id=pad_token_id,
        initializer_range=0.5,
    )
    torch.manual_seed(0)
    return Qwen2ForSequenceClassification(config).eval()


def pad_rows(rows, side, pad=PAD):
    L = max(len(r) for r in rows)
    ids = torch.full((len(rows), L), pad)
    mask = torch.zeros((len(rows), L), dtype=torch.int64)
    for i, r in enumerate(rows):
        span = slice(L - len(r), L) if side == "left" else slice(0, len(r))
        ids[i, span], mask[i, span] = torch.tensor(r), 1
    return ids, mask


ROWS = [[5, 9, 11, 2], [7, 8], [20, 21, 22, 23, 24, 2]]


def test_last_token_index():
    mask = torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    assert last_token_index(mask).tolist() == [2, 3, 3]


def test_padding_side_does_not_change_scores_and_matches_hf_pooling():
    model = tiny_rm()
    rm = SequenceRewardModel(model, batch_size=2)
    singles = torch.cat(
        [rm.score_ids(torch.tensor([r]), torch.ones(1, len(r), dtype=torch.int64)) for r in ROWS]
    )
    for side in ("left", "right"):
        ids, mask = pad_rows(ROWS, side)
        assert torch.allclose(rm.score_ids(ids, mask), singles, atol=1e-5)
    ids, mask = pad_rows(ROWS, "right")
    with torch.no_grad():
        hf = model(input_ids=ids, attention_mask=mask).logits[:, 0]  # HF pools at the last non-pad id
    assert torch.allclose(hf, singles, atol=1e-5)


def test_pad_equal_to_eos_does_not_fool_it():
    # id 2 ends every row AND is the pad id: pooling by pad id picks the wrong token, the mask does not
    model = tiny_rm(pad_token_id=2)
    rm = SequenceRewardModel(model)
    singles = torch.cat(
        [rm.score_ids(torch.tensor([r]), torch.ones(1, len(r), dtype=torch.int64)) for r in ROWS]
    )
    ids, mask = pad_rows(ROWS, "right", pad=2)
    assert torch.allclose(rm.score_ids(ids, mask), singles, atol=1e-5)
    with torch.no_grad():
        hf = model(input_ids=ids, attention_mask=mask).logits[:, 0]
    assert not torch.allclose(hf, singles, atol=1e-3)


def test_conversations_are_templated_with_the_reward_models_tokenizer():
    tokenizer = train_tokenizer(["What is 2+2? Answer: 4", "hello there"] * 3, vocab_size=300)
    rm = SequenceRewardModel(tiny_rm(pad_token_id=tokenizer.pad_token_id, vocab=len(tokenizer)), tokenizer)
    conversations = [
        [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "Answer: 4"}],
        [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "there"}],
    ]
    scores = rm.score_conversations(conversations)
    one = rm.score_conversations(conversations[1:])
    assert scores.shape == (2,) and torch.allclose(scores[1:], one, atol=1e-5)
