"""Layer 5, rollout: attention for one-token decode steps, as two batched matmuls instead of SDPA.

A decode step has one query per row against the row's KV columns. On CPU, torch's fused SDPA kernel
tiles for long queries and runs this shape at about half the speed of the plain computation
(measured on the 10M model, 64 rows × ~300 columns: 2.0 ms against 1.1 ms per layer), so for decode
steps the engine computes, per row r, KV head h and the g = H_q / H_kv query heads sharing it,

    o = softmax(q·Kᵀ · s + m) · V        q [g, D], K, V [S, D], m = 0 where attended, −∞ elsewhere

which is what SDPA computes (s = the model's scaling, default D^-1/2). Anything else — prefill
(several queries), dropout, soft-capping, attention sinks, position biases — goes to the attention
function it replaces, unchanged.

`decode_attention()` installs it, for the duration of a `with` block, as the function
transformers' models look up under "sdpa" (`ALL_ATTENTION_FUNCTIONS`), so the model code, its mask
building and its `config` stay as they are — and under the training engine's packed attention
(`stratarl.engine.varlen_attention`), which an engine serving the actor's own model
(`rollout.weight_sharing`) finds set on it. Nested and concurrent blocks (several engines in
threads) share one installation, undone when the last block exits.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import torch
from torch import Tensor
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from stratarl.engine.varlen_attention import NAME as PACKED_NAME

NAMES = ("sdpa", PACKED_NAME)  # both run SDPA on a decode step's inputs (a query against a cache)
_UNSUPPORTED = ("softcap", "s_aux", "sinks", "position_bias")  # terms SDPA alone does not add
_lock = threading.Lock()
_depth = 0
_replaced: dict[str, Callable | None] = {}  # per name, the local override that was there before


def matmul_decode_attention(
    query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, scaling: float | None
) -> Tensor:
    """[b, 1, H_q, D]: one query per row (query [b, H_q, 1, D]; key, value [b, H_kv, S, D];
    attention_mask [b, 1, 1, S] bool (True = attend) or additive float, or None)."""
    b, Hq, _, D = query.shape
    Hkv = key.shape[1]
    scale = D**-0.5 if scaling is None else scaling
    # query heads h·g … h·g+g−1 read KV head h. q is scaled before the product: on tests/rollout's tiny
    # model that keeps the log-probs within 9.5e-6 of a teacher-forced SDPA forward, scaling the
    # scores after it within 1.24e-5 (the tests allow 1e-5)
    q = query.reshape(b, Hkv, Hq // Hkv, D) * scale
    scores = torch.matmul(q, key.transpose(-1, -2))
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores.masked_fill_(_masked_out(attention_mask), float("-inf"))
        else:
            scores.add_(attention_mask)
    out = torch.matmul(torch.softmax(scores, dim=-1), value)  # [b, H_kv, g, D]
    return out.reshape(b, Hq, 1, D).transpose(1, 2).contiguous()


_inverted: list[tuple[Tensor, Tensor] | None] = [None]  # (mask, ~mask) of the last call


def _masked_out(attention_mask: Tensor) -> Tensor:
    """~mask, computed once per forward: every layer of one forward receives the same mask tensor.
    (One reference is read and written, so engines stepping in several threads cannot mix pairs.)"""
    cached = _inverted[0]
    if cached is None or cached[0] is not attention_mask:
        cached = (attention_mask, ~attention_mask)
        _inverted[0] = cached
    return cached[1]


def _fast_path_applies(query: Tensor, attention_mask: Tensor | None, dropout: float, kwargs: dict) -> bool:
    if query.shape[2] != 1 or dropout != 0.0:
        return False
    if attention_mask is not None and (attention_mask.dim() != 4 or attention_mask.shape[1:3] != (1, 1)):
        return False
    return all(kwargs.get(name) is None for name in _UNSUPPORTED)


def _make_attention(fallback: Callable) -> Callable:
    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        if (
            key.shape[1]
            and query.shape[1] % key.shape[1] == 0
            and _fast_path_applies(query, attention_mask, dropout, kwargs)
        ):
            return matmul_decode_attention(query, key, value, attention_mask, scaling), None
        return fallback(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)

    return attention


@contextlib.contextmanager
def decode_attention() -> Iterator[None]:
    """Within the block, models' "sdpa" attention takes the matmul path for one-token queries."""
    global _depth
    with _lock:
        if _depth == 0:
            for name in NAMES:
                _replaced[name] = ALL_ATTENTION_FUNCTIONS._local_mapping.get(name)
                ALL_ATTENTION_FUNCTIONS[name] = _make_attention(ALL_ATTENTION_FUNCTIONS[name])
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                for name in NAMES:
                    if _replaced[name] is None:
                        del ALL_ATTENTION_FUNCTIONS[name]
                    else:
                        ALL_ATTENTION_FUNCTIONS[name] = _replaced[name]
