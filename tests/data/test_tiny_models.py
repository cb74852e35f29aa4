"""Tiny-model factory: an HF directory that from_pretrained reloads bit-exactly, deterministic per seed."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from stratarl.data.tiny_models import MODEL_PRESETS, build_tiny_model, count_parameters

CORPUS = [f"What is {a}+{b}?" for a in range(20) for b in range(20)] + [f"Answer: {n}" for n in range(60)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(
        tmp_path_factory.mktemp("tiny"), size="1m", corpus_texts=CORPUS, seed=0, vocab_size=384
    )


def test_directory_reloads_with_from_pretrained(model_dir):
    names = {p.name for p in model_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM" and model.config.tie_word_embeddings
    assert model.config.vocab_size == len(tokenizer)  # no logit rows without a token
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id == 2
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id == 3
    assert tokenizer.padding_side == "left"
    hidden = MODEL_PRESETS["1m"]["hidden_size"]
    assert model.get_input_embeddings().weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    assert 0.5e6 < count_parameters(model) < 1.0e6 and model.config.hidden_size == hidden


def test_reload_is_bit_exact_and_generates(model_dir):
    first = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    second = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 3+4?"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    x = torch.tensor([ids])
    with torch.no_grad():
        assert torch.equal(first(x).logits, second(x).logits)
        out = first.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=4, do_sample=False)
    assert out.shape[1] <= x.shape[1] + 4


def test_same_seed_same_weights_other_seed_differs(tmp_path, model_dir):
    again = build_tiny_model(tmp_path / "a", size="1m", corpus_texts=CORPUS, seed=0, vocab_size=384)
    other = build_tiny_model(tmp_path / "b", size="1m", corpus_texts=CORPUS, seed=1, vocab_size=384)
    state = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    same = AutoModelForCausalLM.from_pretrained(again).state_dict()
    diff = AutoModelForCausalLM.from_pretrained(other).state_dict()
    assert all(torch.equal(state[k], same[k]) for k in state)
    assert not torch.equal(state["model.embed_tokens.weight"], diff["model.embed_tokens.weight"])
    assert (again / "tokenizer.json").read_text() == (model_dir / "tokenizer.json").read_text()


def test_global_rng_is_left_alone(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(tmp_path, size="1m", corpus_texts=CORPUS, seed=0, vocab_size=384)
    assert torch.equal(torch.rand(3), expected)


def test_unknown_size_names_the_presets(tmp_path):
    with pytest.raises(ValueError, match="1m, 5m, 10m, 50m"):
        build_tiny_model(tmp_path, size="3m", corpus_texts=CORPUS, seed=0)
