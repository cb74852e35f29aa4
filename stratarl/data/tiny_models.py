"""Layer 5, data: the tiny-model factory — a local tokenizer plus a random-init HF causal LM (and a
Qwen2 sequence-classification reward model on the same tokenizer).

`build_tiny_model` writes a normal Hugging Face directory (config.json, model.safetensors,
generation_config.json, tokenizer.json, tokenizer_config.json, chat_template.jinja) that
`AutoTokenizer.from_pretrained` / `AutoModelForCausalLM.from_pretrained` load. The same corpus and
seed give the same tokenizer and bit-identical weights. `family` picks the architecture (`FAMILIES`:
Qwen2 by default, and one config per common HF causal-LM family, so that every layer can be tested
against each of them on CPU in seconds).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    CohereConfig,
    Gemma2Config,
    Gemma3TextConfig,
    GenerationConfig,
    GPT2Config,
    GraniteConfig,
    LlamaConfig,
    MistralConfig,
    Olmo2Config,
    OPTConfig,
    Phi3Config,
    PretrainedConfig,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForSequenceClassification,
    Qwen3Config,
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


# Sliding windows of the families that have them: shorter than the tests' prompts, so every test of
# such a family crosses a window edge.
TINY_SLIDING_WINDOW = 8


def _alternating(num_layers: int) -> list[str]:
    """sliding, full, sliding, full, …: both layer types in every model of two or more layers."""
    return ["full_attention" if i % 2 else "sliding_attention" for i in range(num_layers)]


def _rope_family(config_class: type[PretrainedConfig], **fixed) -> Callable[[dict, dict], PretrainedConfig]:
    """A family whose config takes the Llama-style names (hidden_size, num_hidden_layers, …)."""

    def make(shape: dict, common: dict) -> PretrainedConfig:
        extra = {k: v(shape) if callable(v) else v for k, v in fixed.items()}
        return config_class(**shape, **common, **extra)

    return make


def _gpt2(shape: dict, common: dict) -> PretrainedConfig:
    """Learned absolute positions, fused qkv (Conv1D), LayerNorm, no GQA."""
    return GPT2Config(
        vocab_size=common["vocab_size"],
        n_positions=common["max_position_embeddings"],
        n_embd=shape["hidden_size"],
        n_layer=shape["num_hidden_layers"],
        n_head=shape["num_attention_heads"],
        n_inner=shape["intermediate_size"],
        tie_word_embeddings=common["tie_word_embeddings"],
        bos_token_id=common["eos_token_id"],
        eos_token_id=common["eos_token_id"],
        pad_token_id=common["pad_token_id"],
        initializer_range=common["initializer_range"],
        resid_pdrop=0.0,  # no dropout, like the other families: RL ratios need a deterministic forward
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )


def _opt(shape: dict, common: dict) -> PretrainedConfig:
    """Learned absolute positions (offset by 2), pre-LayerNorm, no GQA."""
    return OPTConfig(
        vocab_size=common["vocab_size"],
        max_position_embeddings=common["max_position_embeddings"],
        hidden_size=shape["hidden_size"],
        word_embed_proj_dim=shape["hidden_size"],
        num_hidden_layers=shape["num_hidden_layers"],
        num_attention_heads=shape["num_attention_heads"],
        ffn_dim=shape["intermediate_size"],
        tie_word_embeddings=common["tie_word_embeddings"],
        bos_token_id=common["eos_token_id"],
        eos_token_id=common["eos_token_id"],
        pad_token_id=common["pad_token_id"],
        init_std=common["initializer_range"],
        dropout=0.0,
        attention_dropout=0.0,
    )


def _head_dim(shape: dict) -> int:
    return shape["hidden_size"] // shape["num_attention_heads"]


# family -> (shape of a preset, ids/vocab/init shared by all) -> config. Each family keeps what sets it
# apart from Llama: sliding windows (Mistral, Phi-3, Qwen2 with use_sliding_window, Gemma), attention
# and final-logit soft-capping and scaled embeddings (Gemma 2), q/k norms (Qwen3, OLMo 2), fused
# projections (Phi-3, GPT-2), learned absolute positions (GPT-2, OPT), scaled logits (Cohere's
# logit_scale, Granite's logits_scaling with its embedding/residual/attention multipliers).
FAMILIES: dict[str, Callable[[dict, dict], PretrainedConfig]] = {
    "qwen2": _rope_family(Qwen2Config),
    "qwen2-sliding": _rope_family(
        Qwen2Config,
        use_sliding_window=True,
        sliding_window=TINY_SLIDING_WINDOW,
        max_window_layers=1,  # layers from 1 on slide: full and sliding layers in one model
    ),
    "llama": _rope_family(LlamaConfig),
    "smollm2": _rope_family(LlamaConfig, rope_theta=100000.0),  # SmolLM2: a tied Llama
    "mistral": _rope_family(MistralConfig, sliding_window=TINY_SLIDING_WINDOW),
    "qwen3": _rope_family(Qwen3Config, head_dim=_head_dim),
    "gemma2": _rope_family(
        Gemma2Config,
        head_dim=_head_dim,
        sliding_window=TINY_SLIDING_WINDOW,
        layer_types=lambda shape: _alternating(shape["num_hidden_layers"]),
    ),
    "gemma3": _rope_family(
        Gemma3TextConfig,
        head_dim=_head_dim,
        sliding_window=TINY_SLIDING_WINDOW,
        layer_types=lambda shape: _alternating(shape["num_hidden_layers"]),
    ),
    "phi3": _rope_family(Phi3Config, sliding_window=TINY_SLIDING_WINDOW),
    "olmo2": _rope_family(Olmo2Config),
    "cohere": _rope_family(CohereConfig, logit_scale=0.5),
    "granite": _rope_family(
        GraniteConfig,
        logits_scaling=4.0,
        embedding_multiplier=2.0,
        residual_multiplier=0.5,
        attention_multiplier=0.2,
    ),
    "gpt2": _gpt2,
    "opt": _opt,
}
# Untied like the originals (Llama 3, Mistral, Phi-3, OLMo 2); the others tie input and output embeddings.
_UNTIED = {"llama", "mistral", "phi3", "olmo2"}


def tiny_model_config(
    *,
    size: str,
    tokenizer: PreTrainedTokenizerBase,
    family: str = "qwen2",
    max_position_embeddings: int = 512,
    initializer_range: float = 0.02,
) -> PretrainedConfig:
    """A config of family `family` and preset `size` whose vocabulary and special ids match
    `tokenizer` exactly (no unused logit rows a random model could sample)."""
    if size not in MODEL_PRESETS:
        raise ValueError(f"unknown tiny model size {size!r}; choose one of {', '.join(MODEL_PRESETS)}")
    if family not in FAMILIES:
        raise ValueError(f"unknown tiny model family {family!r}; choose one of {', '.join(FAMILIES)}")
    common = dict(
        vocab_size=len(tokenizer),
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=family not in _UNTIED,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=initializer_range,
    )
    return FAMILIES[family](dict(MODEL_PRESETS[size]), common)


def save_tiny_model(
    out_dir: str | Path, *, config: PretrainedConfig, tokenizer: PreTrainedTokenizerBase, seed: int = 0
) -> Path:
    """Initialise a model of `config` from `seed` (in a forked RNG) and save it with `tokenizer`."""
    out = Path(out_dir)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def build_tiny_model(
    out_dir: str | Path,
    *,
    size: str = "1m",
    family: str = "qwen2",
    corpus_texts: Iterable[str],
    seed: int = 0,
    vocab_size: int = 1024,
    max_position_embeddings: int = 512,
) -> Path:
    """Train the tokenizer on `corpus_texts`, initialise a `family` model of preset `size` from
    `seed`, save both. The global torch RNG is left as it was: initialisation runs inside a forked
    RNG. Returns `out_dir`, ready to use as `model.path`.
    """
    tokenizer = train_tokenizer(corpus_texts, vocab_size=vocab_size)
    config = tiny_model_config(
        size=size, tokenizer=tokenizer, family=family, max_position_embeddings=max_position_embeddings
    )
    return save_tiny_model(out_dir, config=config, tokenizer=tokenizer, seed=seed)


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
