"""Our fused decode step (`stratarl.rollout.fused_decode`) against the HF modules it replaces: on every
covered tiny-model family the log-probs it samples equal a plain HF forward (fp32, 1e-5) and the
tokens equal the HF-module decode path's; a weight load lands in it (views) or is picked up per
version (copies of a shared model); a family it does not cover is refused by name or served by HF."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from stratarl.data.tiny_models import FAMILIES, TINY_SLIDING_WINDOW, tiny_model_config
from stratarl.data.tokenizer_factory import train_tokenizer
from stratarl.rollout.fused_decode import FAMILIES as FUSED_FAMILIES
from stratarl.rollout.fused_decode import covers
from stratarl.rollout.interface import GenerationRequest, SamplingParams
from stratarl.rollout.torch_engine import TorchRolloutEngine

CORPUS = [f"What is {a}+{b}?" for a in range(20) for b in range(20)] + [f"Answer: {n}" for n in range(60)]
PROMPT_LENS = (5, 11, 14)  # longer than the sliding window (8), ragged: rows start at different columns
MAX_TOKENS = 12
COVERED = sorted(f for f in FAMILIES if f.split("-")[0] in FUSED_FAMILIES or f == "smollm2")


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(CORPUS, vocab_size=384)


def tiny(tokenizer, family: str, seed: int = 0):
    config = tiny_model_config(size="1m", tokenizer=tokenizer, family=family, initializer_range=0.2)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()


def engine(model, tokenizer, **kwargs) -> TorchRolloutEngine:
    return TorchRolloutEngine(
        model, eos_token_ids=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, seed=0, **kwargs
    )


def requests(tokenizer, temperature: float = 0.9) -> list[GenerationRequest]:
    g = torch.Generator().manual_seed(7)
    low = len(tokenizer.all_special_ids)
    prompts = [tuple(torch.randint(low, len(tokenizer), (n,), generator=g).tolist()) for n in PROMPT_LENS]
    return [
        GenerationRequest(
            f"{i}/{k}", p, SamplingParams(temperature=temperature, max_tokens=MAX_TOKENS, seed=2 * i + k)
        )
        for i, p in enumerate(prompts)
        for k in range(2)
    ]


@torch.no_grad()
def teacher_forced(model, prompt, response, temperature: float) -> torch.Tensor:
    ids = torch.tensor([list(prompt) + list(response)])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def assert_matches_hf_forward(model, results, temperature: float = 0.9) -> None:
    for result in results:
        expected = teacher_forced(model, result.prompt_ids, result.response_ids, temperature)
        torch.testing.assert_close(torch.tensor(result.log_probs), expected, atol=1e-5, rtol=1e-5)


def test_the_covered_families_are_the_llama_shaped_ones():
    assert COVERED == ["llama", "mistral", "qwen2", "qwen2-sliding", "qwen3", "smollm2"]


@pytest.mark.parametrize("family", COVERED)
def test_fused_log_probs_equal_a_plain_hf_forward_and_tokens_the_hf_decode_step(tokenizer, family):
    model = tiny(tokenizer, family)
    fused = engine(model, tokenizer, decode_step="fused")
    assert fused.decode_step_used == "fused"
    results = fused.generate(requests(tokenizer))
    assert max(len(r.prompt_ids) + len(r.response_ids) for r in results) > TINY_SLIDING_WINDOW
    assert_matches_hf_forward(model, results)
    through_hf = engine(tiny(tokenizer, family), tokenizer, decode_step="hf").generate(requests(tokenizer))
    assert [r.response_ids for r in results] == [r.response_ids for r in through_hf]


def test_a_weight_load_lands_in_the_fused_weights(tokenizer):
    """The engine owns its model: q/k/v and gate/up are views into the fused tensors, so a load (which
    copies into the model's tensors) is what the next decode step computes with."""
    model, other = tiny(tokenizer, "qwen2", seed=0), tiny(tokenizer, "qwen2", seed=1)
    served = engine(model, tokenizer)
    served.generate(requests(tokenizer)[:1])
    served.load_weights(other.state_dict(), version=1)
    results = served.generate(requests(tokenizer))
    assert {r.weight_version for r in results} == {1}
    assert_matches_hf_forward(other, results)


def test_a_shared_model_is_not_relaid_out_and_each_version_is_served(tokenizer):
    """Serving the trainer's own model: its tensors keep their storage (its checkpoints save them as
    they were); the fused copies follow an in-place update once the version moves, and are dropped
    with the KV cache."""
    model = tiny(tokenizer, "llama")
    before = {name: p.data_ptr() for name, p in model.named_parameters()}
    served = engine(model, tokenizer, owns_weights=False)
    served.generate(requests(tokenizer)[:2])
    torch.manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p), alpha=0.02)  # an optimizer step, in place
    served.serve_shared_weights(model, version=1)
    results = served.generate(requests(tokenizer))
    assert_matches_hf_forward(model, results)
    assert {name: p.data_ptr() for name, p in model.named_parameters()} == before
    layer_weights = sum(
        p.numel() * p.element_size()
        for name, p in model.named_parameters()
        if any(part in name for part in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"))
    )
    released = served.release_memory()
    assert released >= layer_weights  # the copies go with the KV cache


@pytest.mark.parametrize("family", ["gpt2", "gemma2"])
def test_a_family_not_covered_is_refused_by_name_or_served_by_hf_modules(tokenizer, family):
    model = tiny(tokenizer, family)
    assert covers(model) is not None
    with pytest.raises(ValueError, match=rf"rollout\.decode_step=fused: model_type '{family}' is not among"):
        engine(model, tokenizer, decode_step="fused")
    auto = engine(model, tokenizer)
    assert auto.decode_step_used.startswith("hf (model_type")
    assert_matches_hf_forward(model, auto.generate(requests(tokenizer)))


def test_bf16_fused_decode_stays_within_bf16_of_the_hf_decode_step(tokenizer):
    """bf16 rounds differently per op order: the two paths agree to bf16's precision, not bit for bit."""
    results = {}
    for path in ("fused", "hf"):
        model = tiny(tokenizer, "llama").to(torch.bfloat16)
        greedy = [
            GenerationRequest(r.request_id, r.prompt_ids, SamplingParams(temperature=0.0, max_tokens=6))
            for r in requests(tokenizer)
        ]
        results[path] = engine(model, tokenizer, decode_step=path).generate(greedy)
    for fused, hf in zip(results["fused"], results["hf"], strict=True):
        k = next(
            (i for i, (a, b) in enumerate(zip(fused.response_ids, hf.response_ids, strict=False)) if a != b),
            len(hf.response_ids),
        )
        assert k >= 1  # the first token comes from the same prefill
        torch.testing.assert_close(
            torch.tensor(fused.log_probs[:k]), torch.tensor(hf.log_probs[:k]), atol=0.05, rtol=0.02
        )


def test_validation_knows_the_fused_families():
    from stratarl.config.runtime_checks import FUSED_DECODE_FAMILIES

    assert FUSED_DECODE_FAMILIES == FUSED_FAMILIES


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_one_op_rms_norm_is_the_modules(tokenizer, dtype):
    from stratarl.rollout.fused_decode import _rms_norm

    for family in COVERED:
        norm = tiny(tokenizer, family).model.norm.to(dtype)
        torch.nn.init.normal_(norm.weight)
        x = torch.randn(5, norm.weight.shape[0], dtype=dtype) * 3
        torch.testing.assert_close(_rms_norm(x, norm), norm(x), atol=0, rtol=0)
