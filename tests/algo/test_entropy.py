"""Checks entropy and log-prob from logits: hand values, a plain loop, chunked == plain (values and
gradients, any chunk size, bf16), and that the chunked forms never allocate more than O(chunk·V)."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from stratarl.algo.entropy import (
    entropy_from_logits,
    entropy_from_logits_chunked,
    log_prob_from_logits,
    log_prob_from_logits_chunked,
)


def test_hand_computed():
    # uniform over 4 → H = log 4; logits [0, log 3] → p = [1/4, 3/4],
    # H = −(¼ ln ¼ + ¾ ln ¾) = 0.3465736 + 0.2157616 = 0.5623351
    uniform = torch.zeros(1, 4)
    assert entropy_from_logits(uniform).item() == pytest.approx(math.log(4.0), rel=1e-6)
    two = torch.tensor([[0.0, math.log(3.0)]], dtype=torch.float64)
    expected = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert entropy_from_logits(two).item() == pytest.approx(expected, rel=1e-12)
    assert entropy_from_logits_chunked(two, chunk_size=1).item() == pytest.approx(expected, rel=1e-12)
    # log p(label 1) = ln ¾ = −0.2876821
    label = torch.tensor([1])
    assert log_prob_from_logits(two, label).item() == pytest.approx(math.log(0.75), rel=1e-12)
    assert log_prob_from_logits_chunked(two, label, chunk_size=1).item() == pytest.approx(
        math.log(0.75), rel=1e-12
    )


def test_entropy_matches_plain_loop_and_is_shift_invariant():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 4, 7, generator=gen, dtype=torch.float64) * 2
    got = entropy_from_logits(logits)
    assert got.shape == (3, 4)
    for i in range(3):
        for t in range(4):
            row = logits[i, t].tolist()
            top = max(row)
            z = sum(math.exp(v - top) for v in row)
            probs = [math.exp(v - top) / z for v in row]
            assert got[i, t].item() == pytest.approx(-sum(p * math.log(p) for p in probs), rel=1e-12)
    torch.testing.assert_close(entropy_from_logits(logits + 100.0), got)  # softmax ignores a constant


def _inputs(n=3, t=5, v=11, dtype=torch.float64, seed=1):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, t, v, generator=gen, dtype=torch.float64) * 3).to(dtype)
    labels = torch.randint(0, v, (n, t), generator=gen)
    upstream = torch.randn(n, t, generator=gen, dtype=torch.float64)
    return logits, labels, upstream


@pytest.mark.parametrize("chunk_size", [1, 4, 15, 100])
def test_chunked_entropy_equals_plain_values_and_gradients(chunk_size):
    logits, _, upstream = _inputs()
    plain_in, chunk_in = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    plain, chunked = entropy_from_logits(plain_in), entropy_from_logits_chunked(chunk_in, chunk_size)
    torch.testing.assert_close(chunked, plain, rtol=1e-12, atol=1e-12)
    (g_plain,) = torch.autograd.grad((plain * upstream).sum(), plain_in)
    (g_chunk,) = torch.autograd.grad((chunked * upstream).sum(), chunk_in)
    torch.testing.assert_close(g_chunk, g_plain, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("chunk_size", [1, 4, 15, 100])
def test_chunked_log_prob_equals_plain_values_and_gradients(chunk_size):
    logits, labels, upstream = _inputs()
    plain_in, chunk_in = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    plain = log_prob_from_logits(plain_in, labels)
    chunked = log_prob_from_logits_chunked(chunk_in, labels, chunk_size)
    torch.testing.assert_close(chunked, plain, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(plain, -F.cross_entropy(logits.transpose(1, 2), labels, reduction="none"))
    (g_plain,) = torch.autograd.grad((plain * upstream).sum(), plain_in)
    (g_chunk,) = torch.autograd.grad((chunked * upstream).sum(), chunk_in)
    torch.testing.assert_close(g_chunk, g_plain, rtol=1e-10, atol=1e-12)


def test_bf16_logits_are_computed_in_fp32():
    logits, labels, upstream = _inputs(dtype=torch.bfloat16)
    reference = logits.float()
    ent = entropy_from_logits_chunked(logits, chunk_size=4)
    lp = log_prob_from_logits_chunked(logits, labels, chunk_size=4)
    assert ent.dtype == lp.dtype == log_prob_from_logits(logits, labels).dtype == torch.float32
    torch.testing.assert_close(ent, entropy_from_logits(reference), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lp, log_prob_from_logits(reference, labels), rtol=1e-6, atol=1e-6)
    leaf = logits.clone().requires_grad_()
    (grad,) = torch.autograd.grad((entropy_from_logits_chunked(leaf, 4) * upstream.float()).sum(), leaf)
    assert grad.dtype == torch.bfloat16


def test_empty_and_bad_arguments():
    empty = torch.zeros(0, 5, 9)
    assert entropy_from_logits_chunked(empty, 4).shape == (0, 5)
    assert log_prob_from_logits_chunked(empty, torch.zeros(0, 5, dtype=torch.long), 4).shape == (0, 5)
    with pytest.raises(ValueError, match="chunk_size"):
        entropy_from_logits_chunked(torch.zeros(2, 3), 0)
    with pytest.raises(ValueError, match="labels"):
        log_prob_from_logits_chunked(torch.zeros(2, 3, 4), torch.zeros(2, dtype=torch.long))


class _AllocationTracker(TorchDispatchMode):
    """Records the element count of every tensor an aten op allocates (views and in-place ops excluded)."""

    def __init__(self):
        super().__init__()
        self.allocations: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not any(ret.alias_info is not None for ret in func._schema.returns):
            for leaf in tree_leaves(out):
                if isinstance(leaf, torch.Tensor):
                    self.allocations.append((str(func), leaf.numel()))
        return out

    def largest(self) -> int:
        return max((numel for _, numel in self.allocations), default=0)


N, T, V, CHUNK = 4, 8, 64, 4  # full logits N·T·V = 2048 elements, a chunk CHUNK·V = 256


def _run(fn, with_grad: bool) -> tuple[_AllocationTracker, _AllocationTracker | None]:
    """Allocations of the forward, and of the backward when `with_grad`."""
    logits, labels, upstream = _inputs(N, T, V, dtype=torch.float32, seed=3)
    leaf = logits.requires_grad_(with_grad)
    forward = _AllocationTracker()
    with forward, torch.set_grad_enabled(with_grad):
        out = fn(leaf, labels)
    if not with_grad:
        return forward, None
    backward = _AllocationTracker()
    with backward:
        torch.autograd.grad(out, leaf, grad_outputs=upstream.float())
    return forward, backward


CHUNKED = {
    "entropy": lambda logits, labels: entropy_from_logits_chunked(logits, CHUNK),
    "log_prob": lambda logits, labels: log_prob_from_logits_chunked(logits, labels, CHUNK),
}
PLAIN = {
    "entropy": lambda logits, labels: entropy_from_logits(logits),
    "log_prob": lambda logits, labels: log_prob_from_logits(logits, labels),
}


@pytest.mark.parametrize("name", sorted(CHUNKED))
@pytest.mark.parametrize("with_grad", [False, True])
def test_chunked_forms_allocate_at_most_a_chunk(name, with_grad):
    forward, backward = _run(CHUNKED[name], with_grad)
    assert forward.largest() <= CHUNK * V, forward.allocations
    if backward is not None:
        # The gradient itself is [N, T, V] and is allocated once; everything else is O(chunk·V).
        big = [numel for _, numel in backward.allocations if numel > CHUNK * V]
        assert big == [N * T * V], backward.allocations


@pytest.mark.parametrize("name", sorted(CHUNKED))
def test_chunked_forms_save_only_their_inputs_for_backward(name):
    logits, labels, _ = _inputs(N, T, V, dtype=torch.float32, seed=4)
    leaf = logits.requires_grad_()
    saved: list[torch.Tensor] = []

    def pack(tensor):
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        CHUNKED[name](leaf, labels)
    assert saved  # the hook saw what backward keeps
    assert all(
        t.untyped_storage().data_ptr()
        in (leaf.untyped_storage().data_ptr(), labels.untyped_storage().data_ptr())
        for t in saved
    )


@pytest.mark.parametrize("name", sorted(PLAIN))
def test_the_tracker_sees_the_plain_forms_full_size_intermediates(name):
    # Guards the two tests above: the same measurement flags the unchunked forms.
    forward, backward = _run(PLAIN[name], with_grad=True)
    assert forward.largest() >= N * T * V
    assert sum(numel >= N * T * V for _, numel in backward.allocations) >= 2
