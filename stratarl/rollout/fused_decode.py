"""Layer 5, rollout: our own one-token decode step for Llama-shaped decoders (Llama, Mistral, Qwen2, Qwen3).

A decode step feeds one token per running row. Through the HF modules that is, per layer, three
projections for Q, K and V, rotary embedding, a cache `update`, the attention-function lookup, the
output projection, two RMSNorms of six ops each and an MLP of three projections, plus, per forward,
the model's mask construction (`masking_utils`) — about 40 small ops a layer, each a Python call
and a dispatch that cost as much as the arithmetic on a small model. `FusedDecoder.decode` computes
the same step with fewer, larger ops, for rows r = 1..n at position p_r, hidden state h [n, E]:

    x = RMSNorm(h)                                   RMSNorm(x) = w ⊙ x / sqrt(mean(x²) + ε)
    [q | k | v] = x·W_qkvᵀ + b_qkv                   one GEMM: W_qkv = [W_q; W_k; W_v]
    q, k = RMSNorm_head(q), RMSNorm_head(k)          Qwen3 only (per head, over D)
    q, k = q ⊙ cos(p) + rot(q) ⊙ sin(p), …           rotary embedding, the model's own cos/sin
    K[:, c], V[:, c] = k, v                          written in place at the cache's cursor column c
    o = softmax(q·Kᵀ · s + m) · V                    m = 0 on the row's own columns, −∞ elsewhere
                                                     (and on columns ≤ c − W in a window-W layer)
    h = h + o·W_oᵀ
    [g | u] = RMSNorm(h)·W_guᵀ                       one GEMM: W_gu = [W_gate; W_up]
    h = h + (act(g) ⊙ u)·W_downᵀ
    logits = RMSNorm(h)·W_lmᵀ

which is what the HF layers compute (the tests hold the log-probs within 1e-5 of a teacher-forced
HF forward in fp32, on every family covered). Prefill keeps running through the HF modules: there
every op works on many tokens and the per-op cost is paid once per prompt, not per token.

The fused weights W_qkv and W_gu are laid out once. When the engine owns its copy of the model, the
HF modules' q/k/v and gate/up weights become views into them (no second copy, and a weight load,
which copies into the modules' tensors in place, lands in the fused ones as well). When it serves
the trainer's own model (`rollout.weight_sharing`), the fused weights are copies, made again for each
weight version and dropped with the KV cache (`release`), so the trainer's parameters are never
re-laid out (its checkpoints save them as they were). Either way `decode` first checks that the
layout it computed from still holds and lays it out again if anything replaced a tensor.

Sliding-window layers (Mistral's `sliding_window`, Qwen2/3's `layer_types`) mask what lies W or more
positions back; a row's tokens sit in consecutive columns, so that is W or more columns back.
`covers(model)` says why a model is not covered (a family or a feature outside the list above:
adapters wrapped around the projections, embedding scaling, other layer types), and the engine
then runs the HF modules for decode too (`rollout.decode_step`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from stratarl.rollout.kv_cache import SlotKVCache

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
# Their RMSNorm classes, whose forward is w ⊙ (x / sqrt(mean(x²) + ε)) computed in fp32 (the tests
# compare each with F.rms_norm): the step calls `F.rms_norm`, one op, instead of the module's six.
RMS_NORMS = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")
DECODE_STEPS = ("auto", "fused", "hf")  # rollout.decode_step: fused where covered, always, never


def covers(model: nn.Module) -> str | None:
    """None when `FusedDecoder` can serve `model`'s decode steps, else the reason it cannot."""
    config = getattr(model, "config", None)
    family = getattr(config, "model_type", None)
    if family not in FAMILIES:
        return f"model_type {family!r} is not among the fused families ({', '.join(FAMILIES)})"
    others = set(getattr(config, "layer_types", None) or []) - {"full_attention", "sliding_attention"}
    if others:
        return f"{family}: config.layer_types holds {sorted(others)}"
    if getattr(config, "pretraining_tp", 1) != 1:
        return f"{family}: config.pretraining_tp={config.pretraining_tp}"
    decoder = getattr(model, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if decoder is None or not all(hasattr(decoder, name) for name in needed) or not hasattr(model, "lm_head"):
        return f"{family}: the module tree is not the HF {family} one (model.model.*, lm_head)"
    linears = [model.lm_head]
    for layer in decoder.layers:
        attn, mlp = layer.self_attn, layer.mlp
        linears += [
            attn.q_proj,
            attn.k_proj,
            attn.v_proj,
            attn.o_proj,
            mlp.gate_proj,
            mlp.up_proj,
            mlp.down_proj,
        ]
    wrapped = sorted({type(m).__name__ for m in linears if type(m) is not nn.Linear})
    if wrapped:
        return f"{family}: projections wrapped as {', '.join(wrapped)} (e.g. an adapter), not plain nn.Linear"
    norms = [decoder.norm] + [n for layer in decoder.layers for n in _layer_norms(layer)]
    foreign = sorted({type(n).__name__ for n in norms if type(n).__name__ not in RMS_NORMS})
    if foreign:
        return f"{family}: norms {', '.join(foreign)} are not the Llama-style RMSNorm"
    if type(decoder.embed_tokens) is not nn.Embedding:
        return f"{family}: the embedding is a {type(decoder.embed_tokens).__name__} (scaled or wrapped)"
    return None


def _layer_norms(layer: nn.Module) -> list[nn.Module]:
    attn = layer.self_attn
    extra = [attn.q_norm, attn.k_norm] if hasattr(attn, "q_norm") else []
    return [layer.input_layernorm, layer.post_attention_layernorm, *extra]


def _rms_norm(x: Tensor, norm: nn.Module) -> Tensor:
    """The module's RMSNorm as one op: in fp32 the same values (tested); other dtypes normalize in
    fp32 and scale in theirs, as the HF module does."""
    eps = norm.variance_epsilon
    if x.dtype == torch.float32:
        return F.rms_norm(x, x.shape[-1:], norm.weight, eps)
    return norm.weight * F.rms_norm(x.float(), x.shape[-1:], eps=eps).to(x.dtype)


@dataclass
class _Layer:
    """One decoder layer's tensors in the fused layout (the norms and the rest are the HF modules')."""

    input_norm: nn.Module
    qkv: Tensor  # [(H_q + 2·H_kv)·D, E]
    qkv_bias: Tensor | None
    q_norm: nn.Module | None
    k_norm: nn.Module | None
    o_proj: nn.Linear
    post_norm: nn.Module
    gate_up: Tensor  # [2·I, E]
    gate_up_bias: Tensor | None
    down_proj: nn.Linear
    act: nn.Module
    window: int | None  # sliding-window size W of this layer, None: full attention


class FusedDecoder:
    """The decode step of `model` (covered by `covers`) in the fused layout; see the module doc.

    views: lay the fused weights out once and make the model's own tensors views into them (the
    engine owns the model); else keep them as copies, made again per weight version."""

    def __init__(self, model: nn.Module, *, views: bool) -> None:
        reason = covers(model)
        if reason is not None:
            raise ValueError(f"the fused decode path cannot serve this model: {reason}")
        self.model, self.views = model, views
        config = model.config
        attn = model.model.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.scaling = attn.scaling
        self.windows = _windows(config)
        self.layers: list[_Layer] = []
        self.version: int | None = None  # the weight version the copies hold (views: always current)
        self._pointers: list[int] = []
        if views:  # now, before any weight load captures the model's tensors to copy into
            self._lay_out()

    # --- layout ------------------------------------------------------------------------------
    def _modules_pointers(self) -> list[int]:
        """Where the model's projection tensors live: the layout holds while these do not change."""
        pointers = []
        for layer in self.model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            for linear in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj):
                pointers.append(linear.weight.data_ptr())
                if linear.bias is not None:
                    pointers.append(linear.bias.data_ptr())
        return pointers

    @torch.no_grad()
    def _lay_out(self) -> None:
        self.layers = []
        for layer in self.model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv = _fuse([attn.q_proj, attn.k_proj, attn.v_proj], views=self.views)
            gate_up = _fuse([mlp.gate_proj, mlp.up_proj], views=self.views)
            self.layers.append(
                _Layer(
                    input_norm=layer.input_layernorm,
                    qkv=qkv[0],
                    qkv_bias=qkv[1],
                    q_norm=getattr(attn, "q_norm", None),
                    k_norm=getattr(attn, "k_norm", None),
                    o_proj=attn.o_proj,
                    post_norm=layer.post_attention_layernorm,
                    gate_up=gate_up[0],
                    gate_up_bias=gate_up[1],
                    down_proj=mlp.down_proj,
                    act=mlp.act_fn,
                    window=self.windows[len(self.layers)],
                )
            )
        self._pointers = self._modules_pointers()

    def prepare(self, version: int) -> None:
        """Make the fused weights those of the model now, serving `version` (cheap when they are)."""
        if self.views:
            if not self.layers or self._modules_pointers() != self._pointers:
                self._lay_out()
        elif self.version != version or not self.layers:
            self._lay_out()
        self.version = version

    @property
    def num_bytes(self) -> int:
        """Bytes of the weight copies held (0 for views: they are the model's own tensors)."""
        if self.views:
            return 0
        return sum(t.numel() * t.element_size() for layer in self.layers for t in (layer.qkv, layer.gate_up))

    def release(self) -> int:
        """Drop copies of the weights (views cost nothing and stay); the bytes released."""
        held = self.num_bytes
        if held:
            self.layers, self.version = [], None
        return held

    # --- the step ----------------------------------------------------------------------------
    @torch.inference_mode()
    def decode(self, tokens: Tensor, positions: Tensor, attend: Tensor, cache: SlotKVCache) -> Tensor:
        """Next-token logits [n, V] after feeding `tokens` [n] at `positions` [n, 1].

        attend: [n, S] bool over the cache's columns [lo, cursor] (`SlotKVCache.decode_mask`, which
        fixed lo); each layer's new K/V is written at column `cursor`, which the caller advances."""
        n = tokens.shape[0]
        Hq, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        g = Hq // Hkv
        lo, c = cache._lo, cache.cursor
        # fed as [n, 1], as the model's forward feeds them: hooks on the embedding see the same rows
        h = self.model.model.embed_tokens(tokens[:, None])[:, 0]  # [n, E]
        cos, sin = self.model.model.rotary_emb(h[:, None], positions)  # [n, 1, D] each
        # rot(x) ⊙ sin = roll(x, D/2) ⊙ [−sin₁ | sin₂]: one roll instead of two slices, a negation and a cat
        half = D // 2
        sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        masks = {window: _additive_mask(attend, lo, c, window, h.dtype) for window in set(self.windows)}
        for index, layer in enumerate(self.layers):
            x = _rms_norm(h, layer.input_norm)
            qkv = F.linear(x, layer.qkv, layer.qkv_bias)  # [n, (H_q + 2·H_kv)·D]
            qk = qkv[:, : (Hq + Hkv) * D].view(n, Hq + Hkv, D)  # q's heads, then k's: rotated together
            v = qkv[:, (Hq + Hkv) * D :].view(n, Hkv, D)
            if layer.q_norm is not None:
                qk = torch.cat(
                    (_rms_norm(qk[:, :Hq], layer.q_norm), _rms_norm(qk[:, Hq:], layer.k_norm)), dim=1
                )
            qk = qk * cos + qk.roll(half, dims=-1) * sin  # cos, sin [n, 1, D] broadcast over heads
            q, k = qk[:, :Hq], qk[:, Hq:]
            keys, values = cache.keys[index], cache.values[index]  # [R, H_kv, C, D]
            keys[:n, :, c] = k
            values[:n, :, c] = v
            # query heads j·g … j·g+g−1 read KV head j; q scaled before the product, as
            # decode_attention does (closer to SDPA's rounding than scaling the scores)
            scores = torch.matmul(
                (q * self.scaling).view(n, Hkv, g, D), keys[:n, :, lo : c + 1].transpose(-1, -2)
            )
            scores += masks[layer.window]  # [n, H_kv, g, S]
            o = torch.matmul(torch.softmax(scores, dim=-1), values[:n, :, lo : c + 1])  # [n, H_kv, g, D]
            h = h + layer.o_proj(o.reshape(n, Hq * D))
            gate, up = F.linear(_rms_norm(h, layer.post_norm), layer.gate_up, layer.gate_up_bias).chunk(
                2, dim=-1
            )
            h = h + layer.down_proj(layer.act(gate) * up)
        return self.model.lm_head(_rms_norm(h, self.model.model.norm))  # [n, V]


def _windows(config) -> list[int | None]:
    """Per layer, its sliding window W (None: full attention), as the HF family reads its config."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if config.model_type == "mistral" or layer_types is None:  # one window for every layer, or none
        return [window] * config.num_hidden_layers
    return [window if kind == "sliding_attention" else None for kind in layer_types]


def _additive_mask(attend: Tensor, lo: int, cursor: int, window: int | None, dtype: torch.dtype) -> Tensor:
    """[n, 1, 1, S]: 0 where a row attends column lo + j, −∞ elsewhere. A window-W layer also masks
    the columns ≤ cursor − W (the query sits at column `cursor`: HF's `kv_idx > q_idx − W`)."""
    allowed = attend
    if window is not None:
        columns = torch.arange(lo, cursor + 1, device=attend.device)
        allowed = attend & (columns > cursor - window)[None]
    mask = torch.zeros(attend.shape, dtype=dtype, device=attend.device)
    return mask.masked_fill_(~allowed, float("-inf"))[:, None, None]


def _fuse(linears: list[nn.Linear], *, views: bool) -> tuple[Tensor, Tensor | None]:
    """(W, b): the linears' weights (and biases) stacked along the output rows. views: the linears'
    own tensors then become views into W and b, so what is written into them lands there."""
    weight = torch.cat([linear.weight.detach() for linear in linears])
    has_bias = [linear.bias is not None for linear in linears]
    if any(has_bias) and not all(has_bias):
        raise ValueError("the fused projections have a bias on some of them only")
    bias = torch.cat([linear.bias.detach() for linear in linears]) if all(has_bias) else None
    if views:
        start = 0
        for linear in linears:
            rows = linear.weight.shape[0]
            linear.weight.data = weight[start : start + rows]
            if bias is not None:
                linear.bias.data = bias[start : start + rows]
            start += rows
    return weight, bias
