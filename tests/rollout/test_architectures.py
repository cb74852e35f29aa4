"""The torch rollout engine on every tiny-model family: sampled log-probs equal a plain HF forward (fp32,
1e-5), greedy equals HF `generate`, and KV reused from a prompt or a session equals a fresh prefill."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from stratarl.data.tiny_models import FAMILIES, TINY_SLIDING_WINDOW, tiny_model_config
from stratarl.data.tokenizer_factory import train_tokenizer
from stratarl.rollout.interface import GenerationRequest, SamplingParams
from stratarl.rollout.torch_engine import TorchRolloutEngine, check_architecture

CORPUS = [f"What is {a}+{b}?" for a in range(20) for b in range(20)] + [f"Answer: {n}" for n in range(60)]
# Prompts longer than the sliding window (8), of different lengths so that prefills are left-padded
# and decode rows start at different columns.
PROMPT_LENS = (5, 11, 14)
MAX_TOKENS = 12  # responses cross the window edge too


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(CORPUS, vocab_size=384)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def model(request, tokenizer):
    # A wide init makes next-token distributions peaked, so greedy choices are far from ties.
    config = tiny_model_config(size="1m", tokenizer=tokenizer, family=request.param, initializer_range=0.2)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def engine_for(model, tokenizer, **kwargs) -> TorchRolloutEngine:
    return TorchRolloutEngine(
        model, eos_token_ids=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, seed=0, **kwargs
    )


def prompts(tokenizer) -> list[tuple[int, ...]]:
    g = torch.Generator().manual_seed(7)
    low = len(tokenizer.all_special_ids)  # the specials are ids 0..3
    return [tuple(torch.randint(low, len(tokenizer), (n,), generator=g).tolist()) for n in PROMPT_LENS]


@torch.no_grad()
def teacher_forced_log_probs(model, prompt, response, temperature: float) -> torch.Tensor:
    """log_softmax(z/τ)[token] at each response token, from one plain unpadded forward."""
    ids = torch.tensor([list(prompt) + list(response)])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def test_sampled_log_probs_equal_a_plain_hf_forward(model, tokenizer):
    engine = engine_for(model, tokenizer)
    sampling = [SamplingParams(temperature=0.9, max_tokens=MAX_TOKENS, seed=seed) for seed in range(6)]
    requests = [  # two samples of each prompt, submitted together: one prefill, two rows
        GenerationRequest(f"{i}/{k}", p, sampling[2 * i + k])
        for i, p in enumerate(prompts(tokenizer))
        for k in range(2)
    ]
    results = engine.generate(requests)
    assert max(len(r.prompt_ids) + len(r.response_ids) for r in results) > TINY_SLIDING_WINDOW
    for result in results:
        expected = teacher_forced_log_probs(model, result.prompt_ids, result.response_ids, 0.9)
        torch.testing.assert_close(torch.tensor(result.log_probs), expected, atol=1e-5, rtol=1e-5)


def test_greedy_continuation_equals_hf_generate(model, tokenizer):
    engine = engine_for(model, tokenizer)
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    requests = [GenerationRequest(str(i), p, greedy) for i, p in enumerate(prompts(tokenizer))]
    results = engine.generate(requests)
    for result in results:
        ids = torch.tensor([result.prompt_ids])
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=MAX_TOKENS,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        assert list(result.response_ids) == out[0, ids.shape[1] :].tolist()


def test_kv_reused_from_a_session_or_a_prompt_equals_a_fresh_prefill(model, tokenizer):
    cached, fresh = engine_for(model, tokenizer), engine_for(model, tokenizer, prefix_cache_tokens=0)
    prompt = prompts(tokenizer)[1]
    first = cached.generate([GenerationRequest("t1", prompt, SamplingParams(max_tokens=6, seed=1), "s")])[0]
    # the next turn: the whole first turn, then a tool result / user turn of 3 tokens
    turn2 = first.prompt_ids + first.response_ids + prompts(tokenizer)[0][:3]
    sampling = SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS, seed=2)
    reused = cached.generate([GenerationRequest("t2", turn2, sampling, "s")])[0]
    cached.generate([GenerationRequest("t3", turn2, sampling)])  # prefilled afresh, kept as a prompt entry
    again = cached.generate([GenerationRequest("t4", turn2, sampling)])[0]  # served from that entry
    baseline = fresh.generate([GenerationRequest("t2", turn2, sampling, "s")])[0]
    turn1_fed = len(first.prompt_ids) + len(first.response_ids) - 1  # its last token was never fed
    assert reused.num_cached_tokens == turn1_fed > TINY_SLIDING_WINDOW
    assert again.num_cached_tokens == len(turn2) and baseline.num_cached_tokens == 0
    for result in (reused, again):
        assert result.response_ids == baseline.response_ids
        torch.testing.assert_close(
            torch.tensor(result.log_probs), torch.tensor(baseline.log_probs), atol=1e-5, rtol=1e-5
        )


def test_layers_the_slot_cache_cannot_serve_are_refused_naming_the_config_field(tokenizer):
    config = tiny_model_config(size="1m", tokenizer=tokenizer, family="qwen2")
    config.layer_types = ["full_attention", "chunked_attention", "full_attention", "linear_attention"]
    with pytest.raises(NotImplementedError, match=r"config\.layer_types holds \['chunked_attention', "):
        check_architecture(config)
