"""Chunked head log-prob/entropy equal the naive [K, V] form (value, gradient) and keep no [K, V] tensor."""

import math

import pytest
import torch

from stratarl.engine.fused_head import LogitTransform, head_scores, head_scores_naive, head_sum_pi_squared

K, D, V = 7, 5, 11


def inputs(dtype=torch.float64, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(K, D, generator=g, dtype=dtype).requires_grad_()
    weight = torch.randn(V, D, generator=g, dtype=dtype).requires_grad_()
    b = torch.randn(V, generator=g, dtype=dtype).requires_grad_() if bias else None
    labels = torch.randint(0, V, (K,), generator=g)
    return hidden, weight, b, labels


def value_and_grads(fn, tensors, labels, **kwargs):
    log_prob, entropy = fn(*tensors, labels, **kwargs)
    g = torch.Generator().manual_seed(9)
    # an arbitrary weighting of both outputs, so both backward terms are exercised
    total = (log_prob * torch.randn(K, generator=g, dtype=log_prob.dtype)).sum()
    if entropy is not None:
        total = total + (entropy * torch.randn(K, generator=g, dtype=entropy.dtype)).sum()
    grads = torch.autograd.grad(total, [t for t in tensors if t is not None])
    return log_prob, entropy, grads


@pytest.mark.parametrize("chunk_size", [1, 3, K, 100])
@pytest.mark.parametrize("with_entropy", [True, False])
def test_chunked_equals_naive_in_value_and_gradient(chunk_size, with_entropy):
    hidden, weight, bias, labels = inputs()
    kwargs = dict(temperature=0.7, with_entropy=with_entropy)
    lp, ent, grads = value_and_grads(
        head_scores, (hidden, weight, bias), labels, chunk_size=chunk_size, **kwargs
    )
    lp0, ent0, grads0 = value_and_grads(head_scores_naive, (hidden, weight, bias), labels, **kwargs)
    # The fp64 inputs stay fp64 in the matmul; the logits are then made fp32 (both forms), hence 1e-6.
    torch.testing.assert_close(lp, lp0, atol=1e-6, rtol=1e-6)
    assert (ent is None) == (not with_entropy)
    if with_entropy:  # the naive lse − E[z] loses ~1e-6 to cancellation (test_entropy_of_a_peaked_row…)
        torch.testing.assert_close(ent, ent0, atol=2e-6, rtol=1e-6)
    for a, b in zip(grads, grads0, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("in_loss", ["log_prob", "entropy"])
def test_an_output_left_out_of_the_loss_gets_no_backward_and_the_other_is_exact(in_loss):
    """The entropy is computed for a metric but outside the loss (the default, entropy_coeff 0), or the
    other way round: the unused output's gradient is None in the backward, not a tensor of zeros."""
    hidden, weight, bias, labels = inputs()
    grads = {}
    for fn, kwargs in ((head_scores, {"chunk_size": 3}), (head_scores_naive, {})):
        log_prob, entropy = fn(hidden, weight, bias, labels, temperature=0.7, with_entropy=True, **kwargs)
        used = log_prob if in_loss == "log_prob" else entropy
        weights = torch.linspace(-1.0, 2.0, K, dtype=used.dtype)
        grads[fn] = torch.autograd.grad((used * weights).sum(), [hidden, weight, bias])
    for a, b in zip(grads[head_scores], grads[head_scores_naive], strict=True):
        assert a.abs().max() > 1e-3  # a real gradient, not the zeros of a dropped term
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "transform", [LogitTransform(softcap=1.5), LogitTransform(scale=0.25), LogitTransform(2.0, 3.0)]
)
def test_a_soft_capped_or_scaled_head_equals_the_naive_form_and_the_transform_by_hand(transform):
    hidden, weight, bias, labels = inputs()
    kwargs = dict(temperature=0.7, with_entropy=True, transform=transform)
    lp, ent, grads = value_and_grads(head_scores, (hidden, weight, bias), labels, chunk_size=3, **kwargs)
    lp0, ent0, grads0 = value_and_grads(head_scores_naive, (hidden, weight, bias), labels, **kwargs)
    torch.testing.assert_close(lp, lp0, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ent, ent0, atol=1e-6, rtol=1e-6)
    for a, b in zip(grads, grads0, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    raw = (hidden @ weight.T + bias).detach()  # Gemma: logits = c·tanh(s·r/c); Cohere/Granite: s·r
    logits = raw * transform.scale
    if transform.softcap is not None:
        logits = transform.softcap * torch.tanh(logits / transform.softcap)
    expected = torch.log_softmax(logits / 0.7, -1).gather(-1, labels[:, None]).squeeze(-1)
    torch.testing.assert_close(lp.double(), expected, atol=1e-6, rtol=1e-6)
    assert (lp - head_scores(hidden, weight, bias, labels, temperature=0.7)[0]).abs().max() > 1e-2


def exact_entropy(hidden, weight, bias, temperature):
    """H of the fp32 logits, evaluated in fp64: −Σ π log π."""
    z = ((hidden @ weight.T + (0 if bias is None else bias)).float() / temperature).double()
    return -(z.softmax(-1) * z.log_softmax(-1)).sum(-1)


def test_entropy_of_a_peaked_row_is_exact_to_fp32_precision():
    """H = log S − E_π[z − m] (shifted by the row's max m) has no cancellation: rows with H ≈ 0.002
    and H ≈ 1.3 alike are within 3e-7 of the fp64 value, where lse − E[z] is off by ~1e-6."""
    hidden, weight, bias, labels = (t.detach() if t.dtype.is_floating_point else t for t in inputs())
    truth = exact_entropy(hidden, weight, bias, 0.7)
    assert truth.min() < 0.01 and truth.max() > 1.0  # peaked and flat rows both present
    for chunk_size in (1, 3, 100):
        _, ent = head_scores(
            hidden, weight, bias, labels, temperature=0.7, chunk_size=chunk_size, with_entropy=True
        )
        torch.testing.assert_close(ent.double(), truth, atol=3e-7, rtol=0)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fp32_head_with_a_partial_last_chunk_equals_the_naive_form(bias, temperature):
    """fp32 weights (the matmul writes into the chunk buffer), K = 7 rows in chunks of 3, 3, 1: values
    and all three gradients equal the naive form's; no chunk leaves anything behind in the buffers."""
    hidden, weight, b, labels = inputs(dtype=torch.float32, bias=bias)
    kwargs = dict(temperature=temperature, with_entropy=True)
    lp, ent, grads = value_and_grads(head_scores, (hidden, weight, b), labels, chunk_size=3, **kwargs)
    lp0, ent0, grads0 = value_and_grads(head_scores_naive, (hidden, weight, b), labels, **kwargs)
    torch.testing.assert_close(lp, lp0, atol=2e-6, rtol=1e-6)
    torch.testing.assert_close(ent, ent0, atol=2e-6, rtol=1e-6)
    for a, g in zip(grads, grads0, strict=True):
        assert a.abs().max() > 1e-2
        torch.testing.assert_close(a, g, atol=1e-5, rtol=1e-5)


def test_no_rows_give_zero_gradients():
    hidden, weight, bias, labels = inputs(dtype=torch.float32)
    lp, ent = head_scores(hidden[:0], weight, bias, labels[:0], with_entropy=True)
    grads = torch.autograd.grad((lp.sum() + ent.sum()), [hidden, weight, bias], allow_unused=True)
    assert lp.shape == (0,) and ent.shape == (0,)
    assert all(g is None or (g == 0).all() for g in grads)


def test_values_by_hand_for_a_two_token_vocabulary():
    # h = [1], W = [[1], [0]] → logits (1, 0)/τ with τ = 0.5 → z = (2, 0)
    # log π(0) = 2 − log(e² + 1); H = log(e² + 1) − 2·e²/(e² + 1)
    hidden, weight = torch.tensor([[1.0]]), torch.tensor([[1.0], [0.0]])
    lp, ent = head_scores(hidden, weight, None, torch.tensor([0]), temperature=0.5, with_entropy=True)
    lse = math.log(math.e**2 + 1)
    assert lp.item() == pytest.approx(2 - lse, abs=1e-6)
    assert ent.item() == pytest.approx(lse - 2 * math.e**2 / (math.e**2 + 1), abs=1e-6)


def test_frozen_weight_gets_no_gradient_and_hidden_still_does():
    hidden, weight, _, labels = inputs(dtype=torch.float32, bias=False)
    weight = weight.detach()
    lp, _ = head_scores(hidden, weight, None, labels, chunk_size=2)
    (grad,) = torch.autograd.grad(lp.sum(), [hidden])
    lp0, _ = head_scores_naive(hidden, weight, None, labels)
    (grad0,) = torch.autograd.grad(lp0.sum(), [hidden])
    torch.testing.assert_close(grad, grad0, atol=1e-5, rtol=1e-5)


def saved_bytes(fn, **kwargs):
    """Bytes autograd keeps for the backward of fn's outputs."""
    hidden, weight, _, labels = inputs(dtype=torch.float32, bias=False)
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(hidden, weight, None, labels, with_entropy=True, **kwargs)
    return total


def test_chunked_form_keeps_no_logits_for_the_backward():
    kv_fp32 = K * V * 4
    assert saved_bytes(head_scores_naive) >= 2 * kv_fp32  # logits and softmax, at least
    # hidden [K, D] fp32 + weight [V, D] fp32 + labels [K] int64: nothing of size K·V
    assert saved_bytes(head_scores, chunk_size=2) == K * D * 4 + V * D * 4 + K * 8


def test_bad_arguments_are_rejected():
    hidden, weight, bias, labels = inputs()
    with pytest.raises(ValueError, match="temperature"):
        head_scores(hidden, weight, bias, labels, temperature=0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        head_scores(hidden, weight, bias, labels, chunk_size=0)
    with pytest.raises(ValueError, match="labels"):
        head_scores(hidden, weight, bias, labels[:3])


def test_sum_pi_squared_by_hand_and_chunked():
    # z = (2, 0) as above: π = (e², 1)/(e² + 1) → Σπ² = (e⁴ + 1)/(e² + 1)²
    hidden, weight = torch.tensor([[1.0]]), torch.tensor([[1.0], [0.0]])
    got = head_sum_pi_squared(hidden, weight, None, temperature=0.5)
    assert got.item() == pytest.approx((math.e**4 + 1) / (math.e**2 + 1) ** 2, abs=1e-6)
    hidden, weight, bias, _ = inputs()
    probs = torch.softmax((hidden @ weight.T + bias).float() / 0.7, dim=-1)  # [K, V]
    for chunk_size in (1, 3, None):
        torch.testing.assert_close(
            head_sum_pi_squared(hidden, weight, bias, temperature=0.7, chunk_size=chunk_size),
            (probs**2).sum(-1),
            atol=1e-6,
            rtol=1e-6,
        )
