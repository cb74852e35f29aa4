"""A tokenizer without a pad token pads with EOS and says so; one transformers cannot read is named."""

import pytest

from stratarl.data.tokenizer_factory import train_tokenizer
from stratarl.data.tokenizer_loading import load_tokenizer


def test_a_tokenizer_without_a_pad_token_pads_with_eos_and_says_so(tmp_path, caplog):
    tokenizer = train_tokenizer(["one two three four"] * 20, vocab_size=300)
    tokenizer.pad_token = None
    tokenizer.save_pretrained(tmp_path / "tok")
    loaded = load_tokenizer(tmp_path / "tok")
    assert loaded.pad_token_id == loaded.eos_token_id is not None
    assert (
        "has no pad token; padding with its EOS token" in caplog.text and str(tmp_path / "tok") in caplog.text
    )
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"cannot load the tokenizer in .*broken"):
        load_tokenizer(tmp_path / "broken")
