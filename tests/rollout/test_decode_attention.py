"""The decode-step attention path computes what SDPA computes, and is installed only inside its block."""

import threading

import pytest
import torch
import torch.nn.functional as F
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from stratarl.rollout.decode_attention import decode_attention, matmul_decode_attention


def _sdpa_reference(q, k, v, mask, scaling):
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling).transpose(1, 2)


@pytest.mark.parametrize("heads", [(8, 4), (4, 4), (6, 1)])
@pytest.mark.parametrize("mask_kind", ["bool", "float", "none"])
def test_matmul_decode_attention_equals_sdpa(heads, mask_kind):
    Hq, Hkv = heads
    g = torch.Generator().manual_seed(0)
    b, S, D = 5, 17, 16
    q = torch.randn(b, Hq, 1, D, generator=g)
    k_buf = torch.randn(b, Hkv, 40, D, generator=g)
    k, v = (
        k_buf[:, :, 3 : 3 + S],
        torch.randn(b, Hkv, S, D, generator=g),
    )  # a strided view, as the cache returns
    starts = torch.tensor([0, 4, 9, 16, 2])  # row r attends to columns >= starts[r]
    allowed = (torch.arange(S)[None, :] >= starts[:, None])[:, None, None, :]  # [b, 1, 1, S]
    mask = {
        "bool": allowed,
        "float": torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf")),
        "none": None,
    }[mask_kind]
    got = matmul_decode_attention(q, k, v, mask, scaling=0.3)
    want = _sdpa_reference(q, k, v, mask, 0.3)
    assert got.shape == (b, 1, Hq, D)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_installed_only_inside_the_block_and_restored_after_nesting():
    original = ALL_ATTENTION_FUNCTIONS["sdpa"]
    with decode_attention():
        installed = ALL_ATTENTION_FUNCTIONS["sdpa"]
        assert installed is not original
        with decode_attention():  # nested (or another engine's thread): the same installation
            assert ALL_ATTENTION_FUNCTIONS["sdpa"] is installed
        assert ALL_ATTENTION_FUNCTIONS["sdpa"] is installed
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is original
    assert "sdpa" not in ALL_ATTENTION_FUNCTIONS._local_mapping


def test_concurrent_blocks_leave_the_original_in_place():
    original = ALL_ATTENTION_FUNCTIONS["sdpa"]
    barrier = threading.Barrier(4)

    def worker():
        for _ in range(50):
            with decode_attention():
                barrier.wait(timeout=5) if _ == 0 else None

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is original


def test_prefill_and_soft_capping_go_to_the_replaced_function():
    calls = []

    def fallback(module, query, key, value, attention_mask, **kwargs):
        calls.append((query.shape[2], kwargs.get("softcap")))
        return query.transpose(1, 2), None

    ALL_ATTENTION_FUNCTIONS["sdpa"] = fallback
    try:
        with decode_attention():
            attend = ALL_ATTENTION_FUNCTIONS["sdpa"]
            q1, k = torch.randn(2, 4, 1, 8), torch.randn(2, 2, 5, 8)
            attend(None, torch.randn(2, 4, 3, 8), k, k, None)  # prefill: 3 queries per row
            attend(None, q1, k, k, None, softcap=30.0)  # soft-capping: not plain SDPA
            out, _ = attend(None, q1, k, k, None)  # a plain decode step: the matmul path
        assert calls == [(3, None), (1, 30.0)]
        assert out.shape == (2, 1, 4, 8)
        assert ALL_ATTENTION_FUNCTIONS["sdpa"] is fallback
    finally:
        del ALL_ATTENTION_FUNCTIONS["sdpa"]
