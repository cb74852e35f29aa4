"""Layer 5, training engine: attention over packed sequences without cross-sequence work.

A packed micro-batch is one sequence [1, L] holding several rows. transformers' own fallback for
packed inputs builds a block-diagonal L×L mask and runs SDPA over the whole square: memory O(L²) and
attention FLOPs for every pair of tokens from *different* rows, all of them masked out. This module
registers an attention function, `stratarl_varlen_sdpa`, that reads the row boundaries from the
flash-attention varlen keywords (`cu_seq_lens_q/k`, `max_length_q/k`, verl's `cu_seqlens`) and runs
causal SDPA on each row's slice: attention work Σ s_i² instead of L². Without the keywords it finds
the rows where position_ids restart, as transformers does; other inputs (padded, cached) get
transformers' SDPA with the mask the model built. A sliding-window layer (the attention module
passes `sliding_window`) restricts each row's causal mask to the window, k > q − w, as
`masking_utils.sliding_window_overlay` does.

On a GPU with flash-attn installed the same keywords drive `flash_attention_2`'s varlen kernel, so
`use_varlen_attention` leaves a flash implementation in place. Eager attention stays too: Gemma 2
soft-caps attention scores, which SDPA cannot do (transformers refuses SDPA for it); its packed rows
get transformers' own block-diagonal masks from the restarting position_ids (O(L²) memory).
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "stratarl_varlen_sdpa"


def row_bounds(query: Tensor, kwargs: dict) -> list[int]:
    """[0, end of row 1, …, L] of an unpadded input [b, L]: from `cu_seq_lens_q` when given, else from
    position_ids that restart (transformers' own rule); one row per batch entry when b > 1."""
    L = query.shape[2]
    bounds = kwargs.get("cu_seq_lens_q")
    if bounds is not None:
        return bounds.tolist()
    position_ids = kwargs.get("position_ids")
    if position_ids is None or query.shape[0] != 1:
        return [0, L]
    positions = position_ids.reshape(-1)
    restarts = torch.diff(positions, prepend=positions[:1] - 1) != 1  # [L] a new row starts here
    return [0, *(restarts.nonzero().flatten().tolist()), L]


def _row_attention(query: Tensor, key: Tensor, value: Tensor, window: int | None, **sdpa) -> Tensor:
    """Causal SDPA over one row [b, h, s, e]; within the last `window` keys when a window is set."""
    s = query.shape[2]
    if window is None or s <= window:
        return F.scaled_dot_product_attention(query, key, value, is_causal=True, **sdpa)
    q, k = torch.arange(s, device=query.device)[:, None], torch.arange(s, device=query.device)[None]
    mask = (k <= q) & (k > q - window)  # [s, s]
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, **sdpa)


def varlen_sdpa_attention(
    module: nn.Module,
    query: Tensor,  # [1, h_q, L, e]
    key: Tensor,  # [1, h_kv, L, e]
    value: Tensor,  # [1, h_kv, L, e]
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[Tensor, None]:  # [1, L, h_q, e]
    """Causal SDPA on each packed row; transformers' SDPA for any other input."""
    if attention_mask is not None or query.shape[2] != key.shape[2]:  # padded, or a cached prefix
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    window = kwargs.get("sliding_window")
    sdpa = dict(dropout_p=dropout if module.training else 0.0, scale=scaling)
    sdpa["enable_gqa"] = query.shape[1] != key.shape[1]
    # One split per tensor, not a slice per row: the backward of a slice writes its gradient into a
    # zeroed tensor of the full [1, h, L, e] (rows × L work); the split's backward is one concatenation.
    sizes = [hi - lo for lo, hi in itertools.pairwise(row_bounds(query, kwargs))]
    outputs = [
        _row_attention(q, k, v, window, **sdpa)
        for q, k, v in zip(query.split(sizes, 2), key.split(sizes, 2), value.split(sizes, 2), strict=True)
    ]
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


def _mask_unless_unpadded(
    *args, attention_mask: Tensor | None = None, q_length: int, kv_length: int, **kwargs
):
    """No L×L mask when nothing is padded and there is no cache offset (causal, or packed rows that
    the attention function separates, each within its sliding window); SDPA's mask otherwise."""
    if attention_mask is None and q_length == kv_length:
        return None
    return sdpa_mask(*args, attention_mask=attention_mask, q_length=q_length, kv_length=kv_length, **kwargs)


AttentionInterface.register(NAME, varlen_sdpa_attention)
AttentionMaskInterface.register(NAME, _mask_unless_unpadded)


def use_varlen_attention(model: nn.Module) -> None:
    """Switch `model` (an HF model) from SDPA to per-row attention on packed inputs. Flash and eager
    implementations stay (see the module doc)."""
    if model.config._attn_implementation in ("sdpa", NAME):
        model.set_attn_implementation(NAME)


def varlen_kwargs(lengths: Tensor) -> dict[str, Tensor | int]:
    """The varlen keywords for rows of `lengths` tokens packed back to back (empty rows dropped)."""
    lengths = lengths[lengths > 0]
    bounds = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=lengths.device)
    bounds[1:] = lengths.cumsum(0)
    longest = int(lengths.max()) if len(lengths) else 0
    return {
        "cu_seq_lens_q": bounds,
        "cu_seq_lens_k": bounds,
        "max_length_q": longest,
        "max_length_k": longest,
    }
