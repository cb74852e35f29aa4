"""Tiny Qwen2 models and ragged batches in the batch-edge layout, shared by the engine tests."""

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from stratarl.algo.aggregation import aggregate_loss
from stratarl.transport.data_proto import DataProto

V = 32


def tiny_config(layers: int = 1, vocab: int = V) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
    )  # fmt: skip


def tiny_model(seed: int = 0, layers: int = 1) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(tiny_config(layers))


def ragged_batch(n: int = 8, seed: int = 1, prompt_len: int = 5, response_len: int = 4) -> DataProto:
    """n rows: left-padded prompts of 2..P tokens, right-padded responses of 1..T tokens."""
    g = torch.Generator().manual_seed(seed)
    p_len = torch.randint(2, prompt_len + 1, (n,), generator=g)
    r_len = torch.randint(1, response_len + 1, (n,), generator=g)
    return batch_with_lengths(p_len.tolist(), r_len.tolist(), prompt_len, response_len, generator=g)


def batch_with_lengths(
    prompt_lens: list[int], response_lens: list[int], P: int, T: int, *, generator: torch.Generator
) -> DataProto:
    """Rows with the given prompt and response lengths, padded to P and T, random tokens and advantages."""
    n = len(prompt_lens)
    p_len, r_len = torch.tensor(prompt_lens), torch.tensor(response_lens)
    prompt_mask = (torch.arange(P) >= P - p_len[:, None]).long()
    response_mask = (torch.arange(T) < r_len[:, None]).long()
    prompts = torch.randint(1, V, (n, P), generator=generator) * prompt_mask
    responses = torch.randint(1, V, (n, T), generator=generator) * response_mask
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    return DataProto.from_dict(
        {
            "input_ids": torch.cat([prompts, responses], dim=1), "attention_mask": attention_mask,
            "position_ids": position_ids, "responses": responses, "response_mask": response_mask,
            "advantages": torch.randn(n, T, generator=generator) * response_mask,
        }
    )  # fmt: skip


def policy_gradient_loss(micro, scores, totals):
    """−A·log π, token-mean over the global mini-batch; the metric is this micro-batch's share × D."""
    per_token = -micro["advantages"] * scores.log_prob
    loss = aggregate_loss(
        per_token,
        micro["response_mask"],
        "token-mean",
        global_num_tokens=totals.num_tokens,
        dp_size=totals.dp_size,
    )
    return loss, {"pg_loss": loss.item()}
