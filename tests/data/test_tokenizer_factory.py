"""Local tokenizer: one token per digit, exact decode, ChatML specials, left padding that survives a save."""

from transformers import AutoTokenizer

from stratarl.data.tokenizer_factory import SPECIAL_TOKENS, corpus_from_parquet, train_tokenizer


def test_digits_are_single_tokens(tokenizer):
    tokens = tokenizer.convert_ids_to_tokens(tokenizer.encode("Answer: -1680", add_special_tokens=False))
    assert tokens[-4:] == ["1", "6", "8", "0"]
    for number in ("7", "77", "770", "12345"):
        ids = tokenizer.encode(number, add_special_tokens=False)
        assert len(ids) == len(number)


def test_special_tokens_and_decode_round_trip(tokenizer):
    assert [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    assert (
        tokenizer.eos_token == "<|im_end|>"
        and tokenizer.pad_token == "<|pad|>"
        and tokenizer.bos_token is None
    )
    for text in ("What is 12*3?", "Answer: -5", "unseen text: é ünïcode ☃"):
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    assert len(tokenizer) <= 512
    # A generated response ends in EOS; decoding it for the reward drops the special tokens.
    response = [*tokenizer.encode("Answer: 42", add_special_tokens=False), tokenizer.eos_token_id]
    assert tokenizer.decode(response, skip_special_tokens=True) == "Answer: 42"


def test_save_and_reload_keeps_padding_side_and_template(tmp_path, tokenizer):
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.padding_side == "left"
    assert (loaded.eos_token_id, loaded.pad_token_id) == (2, 3)
    messages = [{"role": "user", "content": "What is 1+2?"}]
    kwargs = dict(add_generation_prompt=True, tokenize=True, return_dict=False)
    assert loaded.apply_chat_template(messages, **kwargs) == tokenizer.apply_chat_template(messages, **kwargs)
    assert loaded(["1", "123"], padding=True)["input_ids"][0][:2] == [3, 3]  # left padded


def test_training_is_deterministic(arithmetic_paths):
    texts = corpus_from_parquet([arithmetic_paths["train"]])
    assert any(t.startswith("Answer: ") for t in texts)  # reference responses join the corpus
    first = train_tokenizer(texts, vocab_size=400)
    second = train_tokenizer(texts, vocab_size=400)
    assert first.backend_tokenizer.to_str() == second.backend_tokenizer.to_str()
