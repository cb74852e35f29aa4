"""The imported SmolLM2-135M-Instruct is a plain HF directory whose greedy output equals the GGUF's."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from stratarl.data.gguf_import import INFO_FILE
from tests.data.real_model import GGUF_FILE, real_model_dir

pytestmark = pytest.mark.real_model


def test_the_directory_is_a_plain_float_llama_with_the_real_tokenizer_and_template():
    path = real_model_dir()
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert len(tokenizer) == 49152 and tokenizer.eos_token == "<|im_end|>"
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )  # the template adds SmolLM2's default system prompt
    assert prompt.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    info = json.loads((path / INFO_FILE).read_text())
    assert info["num_parameters"] == 134_515_008 and all(c["agree"] for c in info["greedy_checks"])
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.dtype == torch.float32 and not getattr(model, "is_quantized", False)


@torch.no_grad()
def test_greedy_continuations_equal_the_gguf_loaded_model():
    path = real_model_dir()
    if not GGUF_FILE.is_file():
        pytest.skip(f"no GGUF at {GGUF_FILE} (make real-model extracts it)")
    pytest.importorskip("gguf", reason="reading GGUF needs the gguf package (make real-model installs it)")
    tokenizer = AutoTokenizer.from_pretrained(path)
    imported = AutoModelForCausalLM.from_pretrained(path).eval()
    gguf = AutoModelForCausalLM.from_pretrained(GGUF_FILE.parent, gguf_file=GGUF_FILE.name).eval()
    for question in ("What is 23 + 19?", "Write one sentence about the sea."):  # not the import's checks
        ids = torch.tensor(
            [
                tokenizer.apply_chat_template(
                    [{"role": "user", "content": question}], add_generation_prompt=True, return_dict=False
                )
            ]
        )
        kwargs = dict(attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=20)
        assert torch.equal(imported.generate(ids, **kwargs), gguf.generate(ids, **kwargs))
