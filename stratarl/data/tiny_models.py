"""Layer 5, data: the tiny-model factory — a local tokenizer plus a random-init Qwen2 causal LM (and a
sequence-classification reward model on the same tokenizer).

`build_tiny_model` writes a normal Hugging Face directory (config.json, model.safetensors,
generation_config.json, tokenizer.json, tokenizer_config.json, chat_template.jinja) that
`AutoTokenizer.from_pretrained` / `AutoModelForCausalLM.from_pretrained` load. The same corpus and
seed give the same tokenizer and bit-identical weights.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from transformers import (
    AutoTokenizer,
    GenerationConfig,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
)

from stratarl.data.tokenizer_factory import train_tokenizer

# Shapes per preset; names give the rough parameter count with a ~512-token vocabulary
# (1m: 0.85M, 5m: 4.4M, 10m: 10.0M, 50m: 47.5M). Tied input/output embeddings throughout.
MODEL_PRESETS: dict[str, dict[str, int]] = {
    "1m": dict(
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=384,
    ),
    "5m": dict(
        hidden_size=192,
        num_hidden_layers=8,
        num_attention_heads=6,
        num_key_value_heads=2,
        intermediate_size=768,
    ),
    "10m": dict(
        hidden_size=256,
        num_hidden_layers=10,
        num_attention_heads=8,
        num_key_value_heads=4,
        intermediate_size=1024,
    ),
    "50m": dict(
        hidden_size=512,
        num_hidden_layers=12,
        num_attention_heads=8,
        num_key_value_heads=4,
        intermediate_size=2048,
    ),
}


def tiny_model_config(
    *, size: str, tokenizer: PreTrainedTokenizerBase, max_position_embeddings: int = 512
) -> Qwen2Config:
    """A Qwen2 config of preset `size` whose vocabulary and special ids match `tokenizer` exactly
    (no unused logit rows a random model could sample)."""
    if size not in MODEL_PRESETS:
        raise ValueError(f"unknown tiny model size {size!r}; choose one of {', '.join(MODEL_PRESETS)}")
    return Qwen2Config(
        vocab_size=len(tokenizer),
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **MODEL_PRESETS[size],
    )


def build_tiny_model(
    out_dir: str | Path,
    *,
    size: str = "1m",
    corpus_texts: Iterable[str],
    seed: int = 0,
    vocab_size: int = 1024,
    max_position_embeddings: int = 512,
) -> Path:
    """Train the tokenizer on `corpus_texts`, initialise a model of preset `size` from `seed`, save both.

    The global torch RNG is left as it was: initialisation runs inside a forked RNG.
    Returns `out_dir`, ready to use as `model.path`.
    """
    out = Path(out_dir)
    tokenizer = train_tokenizer(corpus_texts, vocab_size=vocab_size)
    config = tiny_model_config(
        size=size, tokenizer=tokenizer, max_position_embeddings=max_position_embeddings
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def build_tiny_reward_model(
    out_dir: str | Path, *, tokenizer_dir: str | Path, size: str = "1m", seed: int = 0
) -> Path:
    """A random-init Qwen2 sequence-classification model with one label (a reward model) on the
    tokenizer saved in `tokenizer_dir`, written with that tokenizer to `out_dir` (`reward.model.path`)."""
    out = Path(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = tiny_model_config(size=size, tokenizer=tokenizer)
    config.num_labels = 1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForSequenceClassification(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())
