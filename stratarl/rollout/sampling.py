"""Layer 5, rollout: from next-token logits to a sampled token and its log-prob, row by row.

Processing order (as HF `generate` and vLLM do it): divide by temperature, keep the top-k, keep the
top-p nucleus of what remains, sample from the renormalized result. Greedy rows (temperature 0)
take the argmax of the raw logits.

**The log-prob rule.** For each sampled token a_t the engine reports

    log π(a_t | s_t) = log_softmax(z_t / τ)[a_t]        (τ = 1 for greedy rows)

over the FULL vocabulary, without top-k/top-p masking or renormalization. This is exactly what the
trainer recomputes with a teacher-forced forward (verl's actor divides the logits by the rollout
temperature and takes log_softmax), so with top_k off and top_p = 1 the rollout log-prob equals the
trainer's old log-prob up to numerics, and `rollout_log_probs` can stand in for `old_log_probs`.
With top-k/top-p on, the tokens come from the truncated distribution but the reported number is
still the full-vocabulary one, the same quantity the trainer computes (see docs/rollout.md). Tokens
banned for a row (its stop ids before `min_tokens`) are treated the same way: never drawn, and the
reported log-prob is still the full-vocabulary one.

Randomness: one uniform u ∈ [0, 1) per row and step, turned into a token by inverting the CDF of the
processed distribution, so a row's draw depends only on its own generator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from stratarl.rollout.interface import SamplingParams


@dataclass(frozen=True)
class RowSampling:
    """The sampling params of the n running rows, as tensors (greedy rows hold temperature 0)."""

    temperature: Tensor  # [n] float32
    top_k: Tensor  # [n] int64, <= 0 means off
    top_p: Tensor  # [n] float32

    @classmethod
    def from_params(cls, params: Sequence[SamplingParams], device: torch.device | str) -> RowSampling:
        return cls(
            temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device),
            top_k=torch.tensor([p.top_k for p in params], dtype=torch.int64, device=device),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
        )

    def select(self, rows: Tensor) -> RowSampling:
        """Keep only `rows` (indices into the current n), e.g. when finished rows leave the batch."""
        return RowSampling(self.temperature[rows], self.top_k[rows], self.top_p[rows])


def scale_by_temperature(logits: Tensor, temperature: Tensor) -> Tensor:
    """z / τ per row, in float32; greedy rows (τ = 0) are divided by 1."""
    # logits [n, V], temperature [n]
    tau = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    return logits.float() / tau[:, None]


def mask_top_k_top_p(logits: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """Set to -inf every token outside the row's top-k, then outside the top-p nucleus of the rest.

    Nucleus (Holtzman et al., arXiv:1904.09751): keep token i, in descending order of probability,
    while the mass of the tokens before it is < top_p, so the kept mass is the smallest that
    reaches top_p. Probabilities for the nucleus are taken after the top-k cut (renormalized).
    Ties at the top-k boundary are broken by a stable sort, so exactly k tokens survive.
    """
    # logits [n, V], top_k [n], top_p [n]
    V = logits.shape[-1]
    k = torch.where(top_k > 0, top_k.clamp(max=V), torch.full_like(top_k, V))  # [n]
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)  # [n, V]
    rank = torch.arange(V, device=logits.device)
    keep_sorted = rank[None, :] < k[:, None]  # [n, V]
    probs = torch.softmax(sorted_logits.masked_fill(~keep_sorted, float("-inf")), dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    # top_p = 1 is "off": rounding in the cumsum must not drop the tail of the distribution.
    in_nucleus = (mass_before < top_p[:, None]) | (top_p[:, None] >= 1.0)
    keep_sorted = keep_sorted & in_nucleus
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return logits.masked_fill(~keep, float("-inf"))


def sample_from_uniform(logits: Tensor, uniforms: Tensor) -> Tensor:
    """Inverse-CDF sampling: the token whose CDF interval of softmax(logits) contains u.

    Tokens masked to -inf have zero width and are never returned.
    """
    # logits [n, V], uniforms [n] in [0, 1)
    probs = torch.softmax(logits, dim=-1)
    cdf = probs.cumsum(dim=-1)  # [n, V]
    target = uniforms[:, None].to(cdf.dtype) * cdf[:, -1:]
    tokens = torch.searchsorted(cdf, target, right=True).squeeze(-1)  # [n]
    # u·total can round up to total: fall back to the last token that has probability mass.
    last_live = probs.shape[-1] - 1 - (probs > 0).flip(-1).int().argmax(dim=-1)
    return torch.minimum(tokens, last_live)


def sampled_log_probs(scaled_logits: Tensor, tokens: Tensor) -> Tensor:
    """log_softmax(z / τ)[a] over the full vocabulary (the log-prob rule of this module)."""
    # scaled_logits [n, V], tokens [n]
    return torch.log_softmax(scaled_logits, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)


def next_tokens(
    logits: Tensor, rows: RowSampling, uniforms: Tensor, banned: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """One decoding step for n rows: (tokens [n] int64, log-probs [n] float32 by the module's rule).
    banned [n, V] bool: tokens a row must not draw now (None: none)."""
    # logits [n, V] at the last position, uniforms [n]
    scaled = scale_by_temperature(logits, rows.temperature)
    allowed = scaled if banned is None else scaled.masked_fill(banned, float("-inf"))
    needs_filter = bool(((rows.top_k > 0) | (rows.top_p < 1.0)).any())
    processed = mask_top_k_top_p(allowed, rows.top_k, rows.top_p) if needs_filter else allowed
    sampled = sample_from_uniform(processed, uniforms)
    greedy = allowed.argmax(dim=-1)
    tokens = torch.where(rows.temperature > 0, sampled, greedy)
    return tokens, sampled_log_probs(scaled, tokens)


def banned_tokens(
    banned_ids: Sequence[frozenset[int]], vocab_size: int, device: torch.device | str
) -> Tensor | None:
    """[n, V] bool, True where row i must not draw a token (its `banned_ids[i]`); None when no row
    bans any."""
    if not any(banned_ids):
        return None
    first = banned_ids[0]
    if all(ids == first for ids in banned_ids):  # the usual case (one min_tokens for all): one row
        row = torch.zeros(vocab_size, dtype=torch.bool)
        row[[i for i in first if i < vocab_size]] = True
        return row.to(device).expand(len(banned_ids), vocab_size)
    mask = torch.zeros(len(banned_ids), vocab_size, dtype=torch.bool)
    for row, ids in enumerate(banned_ids):
        mask[row, [i for i in ids if i < vocab_size]] = True
    return mask.to(device)


def draw_uniforms(
    generators: Sequence[torch.Generator | None], shared: torch.Generator, device: torch.device | str
) -> Tensor:
    """One u ∈ [0, 1) per row: from the row's own generator, or else from the shared one."""
    unseeded = [i for i, g in enumerate(generators) if g is None]
    if not unseeded:  # every row seeded: one stack instead of n indexed writes
        return torch.stack([torch.rand((), generator=g) for g in generators]).to(device)
    uniforms = torch.empty(len(generators), dtype=torch.float32)
    uniforms[unseeded] = torch.rand(len(unseeded), generator=shared)
    for i, g in enumerate(generators):
        if g is not None:
            uniforms[i] = torch.rand((), generator=g)
    return uniforms.to(device)
