"""A tiny random Qwen2 causal LM for the rollout tests (vocab 64, hidden 32, 2 layers, 4/2 heads)."""

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

VOCAB = 64
EOS = 2
PAD = 3


def build_tiny_qwen2(seed: int) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        # A wide init makes next-token distributions far from uniform, so comparisons of
        # log-probs, greedy choices and top-k/top-p sets are sharp.
        initializer_range=0.5,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).eval()
