"""Logits processing: temperature, top-k/top-p sets (hand cases, a plain loop, HF's warpers), inverse-CDF
sampling, and the log-prob rule (full-vocabulary log_softmax of logits / temperature)."""

import math

import pytest
import torch
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from stratarl.rollout.interface import SamplingParams
from stratarl.rollout.sampling import (
    RowSampling,
    draw_uniforms,
    mask_top_k_top_p,
    next_tokens,
    sample_from_uniform,
    scale_by_temperature,
)

NEG_INF = float("-inf")


def rows(temperature, top_k, top_p) -> RowSampling:
    return RowSampling(
        torch.tensor(temperature, dtype=torch.float32),
        torch.tensor(top_k, dtype=torch.int64),
        torch.tensor(top_p, dtype=torch.float32),
    )


def test_temperature_divides_sampled_rows_and_leaves_greedy_rows():
    logits = torch.tensor([[1.0, -2.0], [1.0, -2.0], [1.0, -2.0]])
    out = scale_by_temperature(logits, torch.tensor([0.5, 2.0, 0.0]))
    # 1/0.5 = 2, -2/0.5 = -4; 1/2 = 0.5, -2/2 = -1; greedy row divided by 1
    assert torch.equal(out, torch.tensor([[2.0, -4.0], [0.5, -1.0], [1.0, -2.0]]))


def kept(logits_row: torch.Tensor) -> list[int]:
    return torch.isfinite(logits_row).nonzero().squeeze(-1).tolist()


def test_top_k_top_p_hand_cases():
    # token order deliberately scrambled: probabilities 0.15, 0.5, 0.05, 0.3
    logits = torch.tensor([0.15, 0.5, 0.05, 0.3]).log().repeat(5, 1)
    out = mask_top_k_top_p(
        logits, top_k=torch.tensor([0, 2, 0, 0, 2]), top_p=torch.tensor([1.0, 1.0, 0.7, 0.85, 0.52])
    )
    assert kept(out[0]) == [0, 1, 2, 3]  # both off
    assert kept(out[1]) == [1, 3]  # the two most likely: 0.5, 0.3
    # descending 0.5, 0.3, 0.15, 0.05 has mass before each 0, 0.5, 0.8, 0.95; keep while < 0.7
    assert kept(out[2]) == [1, 3]
    assert kept(out[3]) == [0, 1, 3]  # < 0.85 keeps three
    # after top-2 the renormalized probs are 0.5/0.8 = 0.625 and 0.375: mass before the second
    # is 0.625 >= 0.52, so the nucleus is one token (without top-k it would be two: 0.5 < 0.52)
    assert kept(out[4]) == [1]
    assert torch.equal(out[4, 1], logits[4, 1])  # surviving logits are untouched


def loop_top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Plain-Python reference: one row at a time, one token at a time."""
    out = torch.full_like(logits, NEG_INF)
    for r in range(logits.shape[0]):
        order = sorted(range(logits.shape[1]), key=lambda i: -logits[r, i].item())
        k = top_k[r] if top_k[r] > 0 else len(order)
        survivors = order[:k]
        z = [math.exp(logits[r, i].item()) for i in survivors]
        probs = [x / sum(z) for x in z]
        mass = 0.0
        for i, p in zip(survivors, probs, strict=True):
            if mass < top_p[r] or top_p[r] >= 1.0:
                out[r, i] = logits[r, i]
            mass += p
    return out


def test_top_k_top_p_matches_a_plain_loop():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 40, generator=g) * 3
    top_k, top_p = [0, 1, 5, 0, 12, 40], [1.0, 1.0, 0.9, 0.3, 0.6, 0.999]
    out = mask_top_k_top_p(logits, torch.tensor(top_k), torch.tensor(top_p))
    assert torch.equal(out, loop_top_k_top_p(logits, top_k, top_p))


@pytest.mark.parametrize(("top_k", "top_p"), [(5, 1.0), (0, 0.8), (7, 0.5), (0, 0.3)])
def test_top_k_top_p_agree_with_hf_warpers(top_k, top_p):
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(4, 64, generator=g) * 2
    ours = mask_top_k_top_p(logits, torch.full((4,), top_k), torch.full((4,), top_p))
    hf = logits
    if top_k > 0:
        hf = TopKLogitsWarper(top_k)(None, hf)
    if top_p < 1.0:
        hf = TopPLogitsWarper(top_p)(None, hf)
    assert torch.equal(torch.isfinite(ours), torch.isfinite(hf))


def test_inverse_cdf_hand_cases_never_pick_zero_probability_tokens():
    logits = torch.tensor([0.5, 0.0, 0.3, 0.2]).log().repeat(6, 1)  # token 1 has probability 0
    # cdf = 0.5, 0.5, 0.8, 1.0
    u = torch.tensor([0.0, 0.1, 0.5, 0.79, 0.81, 0.99999994])
    assert sample_from_uniform(logits, u).tolist() == [0, 0, 2, 2, 3, 3]
    # the last token masked: even u just below 1 must not return it
    masked_tail = torch.tensor([[0.6, 0.4, 0.0]]).log()
    assert sample_from_uniform(masked_tail, torch.tensor([0.99999994])).tolist() == [1]


def test_inverse_cdf_frequencies_follow_the_probabilities():
    probs = torch.tensor([0.1, 0.25, 0.4, 0.25])
    M = 10_000
    u = (torch.arange(M, dtype=torch.float32) + 0.5) / M  # an even grid over [0, 1)
    tokens = sample_from_uniform(probs.log().expand(M, 4), u)
    freq = torch.bincount(tokens, minlength=4).float() / M
    assert torch.allclose(freq, probs, atol=2 / M)


def test_log_prob_is_full_vocabulary_log_softmax_of_scaled_logits():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 16, generator=g) * 2
    sampling = rows([0.7, 1.3, 0.0], [1, 4, 0], [1.0, 0.5, 1.0])
    tokens, log_probs = next_tokens(logits, sampling, torch.tensor([0.3, 0.6, 0.9]))
    tau = torch.tensor([0.7, 1.3, 1.0])  # greedy row: temperature 1 for the log-prob
    full = torch.log_softmax(logits / tau[:, None], dim=-1)
    assert torch.allclose(log_probs, full.gather(-1, tokens[:, None]).squeeze(-1), atol=1e-6)
    assert tokens[0] == logits[0].argmax()  # top_k = 1 picks the argmax...
    assert log_probs[0] < -1e-3  # ...yet reports its full-vocabulary log-prob, not log 1 = 0
    assert tokens[2] == logits[2].argmax()  # greedy row


def test_greedy_rows_ignore_the_uniform():
    logits = torch.tensor([[0.0, 3.0, 1.0]]).repeat(3, 1)
    tokens, _ = next_tokens(logits, rows([0.0] * 3, [0] * 3, [1.0] * 3), torch.tensor([0.0, 0.5, 0.999]))
    assert tokens.tolist() == [1, 1, 1]


def test_seeded_rows_draw_the_same_uniform_wherever_they_sit():
    def seeded(seed):
        return torch.Generator().manual_seed(seed)

    alone = draw_uniforms([seeded(7)], torch.Generator().manual_seed(0), "cpu")
    mixed = draw_uniforms([None, seeded(5), seeded(7)], torch.Generator().manual_seed(1), "cpu")
    assert mixed[2] == alone[0]
    assert mixed[1] != alone[0]
    assert ((mixed >= 0) & (mixed < 1)).all()


def test_row_sampling_from_params_and_select():
    params = [SamplingParams(temperature=0.0), SamplingParams(top_k=-1, top_p=0.9)]
    r = RowSampling.from_params(params, "cpu")
    assert r.temperature.tolist() == [0.0, 1.0] and r.top_k.tolist() == [0, -1]
    picked = r.select(torch.tensor([1]))
    assert picked.top_p.tolist() == pytest.approx([0.9])
