"""The training engine on every tiny-model family: packed log-probs, entropies and gradients equal the
padded layout's, and both equal a plain HF forward of each row (soft-capped Gemma logits included)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from stratarl.data.tiny_models import FAMILIES, TINY_SLIDING_WINDOW, tiny_model_config
from stratarl.data.tokenizer_factory import train_tokenizer
from stratarl.engine.actor import compute_log_probs
from stratarl.engine.forward import PolicyScorer
from stratarl.engine.packing import LAYOUTS
from tests.engine.tiny_batches import batch_with_lengths

CORPUS = [f"What is {a}+{b}?" for a in range(20) for b in range(20)] + [f"Answer: {n}" for n in range(60)]
TEMPERATURE = 0.8
# rows longer than the sliding window (8), of ragged prompt and response lengths
PROMPT_LENS, RESPONSE_LENS, P, T = [3, 9, 12, 6], [10, 4, 7, 1], 12, 10


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(CORPUS, vocab_size=384)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def model(request, tokenizer):
    config = tiny_model_config(size="1m", tokenizer=tokenizer, family=request.param, initializer_range=0.2)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


def batch(model):
    torch.manual_seed(3)  # batch_with_lengths draws tokens below tiny_batches.V, inside every vocab here
    return batch_with_lengths(PROMPT_LENS, RESPONSE_LENS, P, T, generator=torch.Generator().manual_seed(3))


@torch.no_grad()
def plain_log_probs(model, data) -> torch.Tensor:
    """[N, T] from one unpadded HF forward per row: log_softmax(logits / τ) at each response token."""
    out = torch.zeros(len(PROMPT_LENS), T)
    for i, (p, r) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS, strict=True)):
        ids = torch.cat([data["input_ids"][i, P - p : P], data["input_ids"][i, P : P + r]])[None]
        logits = model(input_ids=ids).logits[0, p - 1 : -1].float() / TEMPERATURE
        out[i, :r] = torch.log_softmax(logits, -1).gather(-1, ids[0, p:, None]).squeeze(-1)
    return out


def test_packed_and_padded_log_probs_and_entropy_equal_a_plain_forward(model):
    data = batch(model)
    assert max(p + r for p, r in zip(PROMPT_LENS, RESPONSE_LENS, strict=True)) > TINY_SLIDING_WINDOW
    expected = plain_log_probs(model.eval(), data)
    kwargs = dict(micro_batch_size=4, temperature=TEMPERATURE, with_entropy=True)
    packed = compute_log_probs(model, data, layout="packed", **kwargs)
    padded = compute_log_probs(model, data, layout="padded", logit_chunk_size=None, **kwargs)
    torch.testing.assert_close(packed[0], expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(padded[0], expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed[1], padded[1], atol=1e-5, rtol=1e-5)


def test_packed_and_padded_gradients_agree(model):
    data = batch(model)
    model.train()  # as the actor updates (the tiny models have no dropout)
    grads = {}
    for layout in ("packed", "padded"):
        model.zero_grad()
        scorer = PolicyScorer(model)
        inputs = LAYOUTS[layout](data["input_ids"], data["attention_mask"], data["position_ids"], T)
        scores = scorer.score(inputs, temperature=TEMPERATURE, with_entropy=True)
        (scores.log_prob.sum() + 0.1 * scores.entropy.sum()).backward()
        grads[layout] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert grads["packed"].keys() == grads["padded"].keys() and grads["packed"]
    for name, grad in grads["packed"].items():  # fp32 sums in another order: 1e-5 of the tensor's scale
        reference = grads["padded"][name]  # (at least 1: e.g. a key bias's gradient is 0 up to rounding)
        scale = max(float(reference.abs().max()), 1.0)
        torch.testing.assert_close(grad, reference, atol=1e-5 * scale, rtol=1e-4, msg=name)
