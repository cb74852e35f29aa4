"""The head's top-k: the teacher's K most likely tokens and their log-probs, and the student's
log-probs at given ids with their gradient, chunked, against a plain log-softmax over all logits."""

import pytest
import torch

from stratarl.engine.fused_head import IDENTITY, LogitTransform, head_logits
from stratarl.engine.top_k_head import head_log_probs_at, head_top_k

N, D, VOCAB, K = 11, 8, 40, 5


def inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, D, generator=g, dtype=torch.float64).requires_grad_(True)
    weight = torch.randn(VOCAB, D, generator=g, dtype=torch.float64).requires_grad_(True)
    bias = torch.randn(VOCAB, generator=g, dtype=torch.float64).requires_grad_(True)
    return hidden, weight, bias


def plain_log_softmax(hidden, weight, bias, transform=IDENTITY):
    return torch.log_softmax(head_logits(hidden, weight, bias, 0.7, transform), dim=-1)  # [N, V]


@pytest.mark.parametrize("chunk_size", [None, 1, 4, 64])
def test_top_k_is_the_plain_top_k_of_the_log_softmax(chunk_size):
    hidden, weight, bias = inputs()
    transform = LogitTransform(scale=1.5, softcap=3.0)
    ids, log_probs = head_top_k(
        hidden, weight, bias, K, temperature=0.7, chunk_size=chunk_size, transform=transform
    )
    top = plain_log_softmax(hidden, weight, bias, transform).topk(K, dim=-1)
    assert ids.dtype == torch.long and ids.shape == (N, K)
    assert torch.equal(ids, top.indices)
    torch.testing.assert_close(log_probs, top.values.float(), rtol=0, atol=1e-6)
    assert torch.all(log_probs[:, :-1] >= log_probs[:, 1:])  # most likely first


@pytest.mark.parametrize("chunk_size", [None, 1, 4, 64])
def test_log_probs_at_ids_and_their_gradient_match_the_plain_form(chunk_size):
    hidden, weight, bias = inputs()
    ids = torch.randint(0, VOCAB, (N, K), generator=torch.Generator().manual_seed(3))
    upstream = torch.randn(N, K, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    got, own = head_log_probs_at(hidden, weight, bias, ids, temperature=0.7, chunk_size=chunk_size)
    (got * upstream).sum().backward()
    grads = [t.grad.clone() for t in (hidden, weight, bias)]
    for t in (hidden, weight, bias):
        t.grad = None
    plain = plain_log_softmax(hidden, weight, bias)
    (plain.gather(-1, ids) * upstream).sum().backward()
    torch.testing.assert_close(got, plain.gather(-1, ids).float(), rtol=0, atol=1e-6)
    assert torch.equal(own, plain.topk(K, dim=-1).indices)
    for mine, theirs in zip(grads, (hidden.grad, weight.grad, bias.grad), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-9, atol=1e-12)


def test_no_rows_give_empty_outputs_and_k_beyond_the_vocabulary_is_refused():
    hidden, weight, bias = inputs()
    got, own = head_log_probs_at(hidden[:0], weight, bias, torch.zeros(0, K, dtype=torch.long), chunk_size=4)
    assert got.shape == own.shape == (0, K)
    with pytest.raises(ValueError, match="k=41"):
        head_top_k(hidden, weight, bias, VOCAB + 1)
