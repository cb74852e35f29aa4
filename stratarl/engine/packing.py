"""Layer 5, training engine: model inputs for a micro-batch, packed (no padding) or padded.

At the batch edge a row is a left-padded prompt then a right-padded response, [m, P+T]
(docs/design.md#batch-conventions).
`pack_rows` removes every padding token and concatenates the rows into one sequence [1, L],
L = Σ attention_mask, positions restarting at 0 for each row (verl's `use_remove_padding`), with
attention split at the row boundaries (`varlen_attention`, flash-attn's varlen keywords: no work on
pairs of tokens from different rows). `pad_rows` keeps the [m, P+T] layout; both say which model
outputs score which response token.

Which output scores which token: the output at position t−1 reads the prefix (x, y_<t); it gives
log π(y_t | x, y_<t) for the actor and V(s_t), s_t = (x, y_<t), for the critic (verl reads both at
`[:, -T-1:-1]`). A response token whose predecessor is padding (an empty prompt) is not scored.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from stratarl.engine.varlen_attention import varlen_kwargs


@dataclass
class ModelInputs:
    """What one forward computes, and where its scores go in the [m, T] response grid."""

    input_ids: Tensor  # [b, L]: [1, Σ tokens] packed or [m, P+T] padded
    position_ids: Tensor  # [b, L]
    attention_mask: Tensor | None  # [b, L] padded; None packed (positions mark the boundaries)
    score_index: Tensor  # [K] flat positions in b·L whose output scores a response token
    labels: Tensor  # [K] the response token each of them predicts
    rows: Tensor  # [K] row of the score in [m, T]
    cols: Tensor  # [K] response column of the score
    num_rows: int  # m
    response_len: int  # T
    sequence_lengths: Tensor  # [m] tokens of each row, padding excluded
    attention_kwargs: dict = field(default_factory=dict)  # packed: the rows' boundaries (varlen keywords)
    # [K, k] token ids at which the forward also scores log π (the teacher's top-k, distillation's
    # forward_kl_topk); None: only the labels are scored
    score_at_ids: Tensor | None = None

    @property
    def real_tokens(self) -> int:
        """Σ attention_mask: the token positions that are not padding."""
        return int(self.sequence_lengths.sum())

    @property
    def computed_tokens(self) -> int:
        """Token positions the forward runs over, padding included (b·L)."""
        return self.input_ids.numel()

    def to_grid(self, scores: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """[K, ...] -> [m, T, ...] in `dtype`, 0 where no score (padding or a token without a
        predecessor)."""
        grid = scores.new_zeros((self.num_rows, self.response_len, *scores.shape[1:]), dtype=dtype)
        return grid.index_put((self.rows, self.cols), scores.to(dtype))


def _scored_positions(attention_mask: Tensor, response_len: int) -> tuple[Tensor, Tensor]:
    """(rows, cols) of response tokens that are attended and whose predecessor is attended."""
    keep = attention_mask.bool()
    prompt_len = keep.shape[1] - response_len
    if prompt_len < 1:
        raise ValueError(f"need at least one prompt column before the {response_len} response columns")
    scored = keep[:, prompt_len:] & keep[:, prompt_len - 1 : -1]  # [m, T]
    return scored.nonzero(as_tuple=True)


def pack_rows(
    input_ids: Tensor,  # [m, P+T]
    attention_mask: Tensor,  # [m, P+T]
    position_ids: Tensor,  # [m, P+T], 0 at each row's first token
    response_len: int,  # T
) -> ModelInputs:
    """All rows as one padding-free sequence [1, L]."""
    keep = attention_mask.bool()
    lengths = keep.sum(dim=1)  # [m]
    offsets = lengths.cumsum(0) - lengths  # [m] where each row starts in the packed sequence
    packed_pos = position_ids[keep]  # [L]
    firsts = packed_pos[offsets[lengths > 0]]
    if torch.any(firsts != 0):
        raise ValueError("packing needs position_ids that start at 0 on each row's first attended token")
    rows, cols = _scored_positions(attention_mask, response_len)
    prompt_len = input_ids.shape[1] - response_len
    packed_index = keep.long().cumsum(dim=1) - 1 + offsets[:, None]  # [m, P+T] packed slot of a column
    return ModelInputs(
        input_ids=input_ids[keep][None],
        position_ids=packed_pos[None],
        attention_mask=None,
        score_index=packed_index[rows, prompt_len - 1 + cols],
        labels=input_ids[rows, prompt_len + cols],
        rows=rows,
        cols=cols,
        num_rows=input_ids.shape[0],
        response_len=response_len,
        sequence_lengths=lengths,
        attention_kwargs=varlen_kwargs(lengths),
    )


def pad_rows(
    input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, response_len: int
) -> ModelInputs:
    """The rows as they are, [m, P+T] with an attention mask (the reference layout for packing)."""
    rows, cols = _scored_positions(attention_mask, response_len)
    width = input_ids.shape[1]
    prompt_len = width - response_len
    lengths = attention_mask.bool().sum(dim=1)
    return ModelInputs(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=attention_mask,
        score_index=rows * width + prompt_len - 1 + cols,
        labels=input_ids[rows, prompt_len + cols],
        rows=rows,
        cols=cols,
        num_rows=input_ids.shape[0],
        response_len=response_len,
        sequence_lengths=lengths,
    )


LAYOUTS = {"packed": pack_rows, "padded": pad_rows}


def padding_share(computed_tokens: int, real_tokens: int) -> float:
    """Share of computed token positions that are padding: (computed − real) / computed."""
    return 0.0 if computed_tokens == 0 else (computed_tokens - real_tokens) / computed_tokens
