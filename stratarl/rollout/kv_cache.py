"""Layer 5, rollout: the KV cache of the torch engine's running batch, and the one its prefills use.

`SlotKVCache` holds, per layer, preallocated K and V of shape [R, H, C, D] (R row slots, H KV
heads, C columns, D head dim). Rows are the running sequences, kept contiguous in slots 0..n-1;
columns are one timeline shared by all rows: every row ends at column `cursor` and starts where its
own tokens start (`start[r]`), so a decode step writes all n new tokens into column `cursor` at
once, without the per-step copy of a concatenating cache. A row joins by copying its prompt's KV
into the columns just before `cursor` (the same block copied n ways for n samples of one prompt),
and leaves by moving the last row into its slot. Buffers start zeroed: masked columns must hold
finite values (SDPA adds the mask to Q·Kᵀ, and NaN + (−∞) is NaN).

Both classes speak the part of transformers' `Cache` protocol that a model's forward and
`transformers.masking_utils` read: attention layers call `update(k, v, layer_idx)` and attend over
what it returns; mask construction asks `get_query_offset` (where the queries sit) and
`get_mask_sizes` (how many key columns, from where). The model then builds its own masks — causal,
sliding-window, per layer type — from the engine's 2D mask over those columns, as in HF `generate`.
A row's tokens sit in consecutive columns, so a distance in columns is a distance in positions and a
sliding window measured in columns is the model's window.
"""

from __future__ import annotations

import torch
from torch import Tensor

KV = list[tuple[Tensor, Tensor]]  # per layer: (K, V), each [rows, H, L, D]


class PrefillCache:
    """Collects the K/V a prefill forward computes, after an optional cached past of the same rows."""

    def __init__(self, past: KV | None = None) -> None:
        self.past = past
        self.layers: KV = []

    def update(self, key: Tensor, value: Tensor, layer_idx: int, *args, **kwargs) -> tuple[Tensor, Tensor]:
        # key, value [b, H, S, D] for the S tokens fed; attention sees past + new
        if self.past is not None:
            past_k, past_v = self.past[layer_idx]
            key, value = torch.cat([past_k, key], dim=2), torch.cat([past_v, value], dim=2)
        self.layers.append((key, value))
        return key, value

    @property
    def past_length(self) -> int:
        return 0 if self.past is None else self.past[0][0].shape[2]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.past_length

    def get_query_offset(self, layer_idx: int = 0) -> int:
        """The fed tokens follow the past: queries sit at columns past_length, past_length + 1, …"""
        return self.past_length

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        """(kv_length, kv_offset): attention spans the past and the fed tokens, from column 0."""
        return self.past_length + query_length, 0


class SlotKVCache:
    """The running batch's KV: n rows in slots 0..n-1, columns [lo, cursor) live (see module doc)."""

    def __init__(self, initial_rows: int = 8, initial_columns: int = 256) -> None:
        self.keys: list[Tensor] = []  # per layer [R, H, C, D], allocated by the first admit
        self.values: list[Tensor] = []
        self.num_rows = 0
        self.cursor = 0
        self.start = torch.zeros(0, dtype=torch.int64)  # [R] first live column of each slot
        self._initial = (initial_rows, initial_columns)
        self._lo = 0  # the span fixed by `decode_mask` for the forward that follows

    @property
    def num_bytes(self) -> int:
        """Bytes of the allocated K/V buffers (live or not: they are kept for the next rows)."""
        return sum(t.numel() * t.element_size() for buffers in (self.keys, self.values) for t in buffers)

    @property
    def span_start(self) -> int:
        """lo: the first column any running row uses."""
        return int(self.start[: self.num_rows].min()) if self.num_rows else self.cursor

    # --- HF cache protocol (decode: one new token per row, written at `cursor`) ----------------
    def update(self, key: Tensor, value: Tensor, layer_idx: int, *args, **kwargs) -> tuple[Tensor, Tensor]:
        n, c = self.num_rows, self.cursor
        self.keys[layer_idx][:n, :, c] = key[:, :, 0]  # key [n, H, 1, D]
        self.values[layer_idx][:n, :, c] = value[:, :, 0]
        lo = self._lo
        return self.keys[layer_idx][:n, :, lo : c + 1], self.values[layer_idx][:n, :, lo : c + 1]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.cursor - self.span_start

    # Mask sizes count columns from lo, the span `update` returns: the query (column `cursor`) sits
    # at cursor − lo, and keys run over the cursor − lo + 1 columns [lo, cursor].
    def get_query_offset(self, layer_idx: int = 0) -> int:
        return self.cursor - self._lo

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.cursor - self._lo + query_length, 0

    def decode_mask(self) -> Tensor:
        """[n, cursor + 1 - lo] bool over columns [lo, cursor]: row r attends to its own columns and
        the one being written (the 2D mask the model builds its attention masks from).

        Also fixes the span the next `update` calls return; call it once before each decode forward,
        after `ensure_columns(1)`.
        """
        self._lo = self.span_start
        columns = torch.arange(self._lo, self.cursor + 1, device=self.start.device)
        return columns[None, :] >= self.start[: self.num_rows, None]

    def advance(self) -> None:
        """The decode step wrote column `cursor`; the next one writes the column after it."""
        self.cursor += 1

    # --- membership ------------------------------------------------------------------------------
    def admit(self, kv: KV, copies: int) -> None:
        """Append `copies` rows holding the same prefix KV (each layer's K/V [1, H, L, D])."""
        L = kv[0][0].shape[2]
        if not self.keys:
            self._allocate(kv, rows=max(self._initial[0], copies), columns=max(self._initial[1], 2 * L))
        R, C = self.keys[0].shape[0], self.keys[0].shape[2]
        if self.num_rows == 0:
            self.cursor = L  # nothing live: restart the timeline at the prefix's end
            if L >= C:
                self._relayout(rows=R, columns=2 * L, shift=0)
        elif self.cursor < L:  # a prefix longer than the timeline so far: shift everything right
            self._relayout(rows=R, columns=C + L - self.cursor, shift=L - self.cursor)
        self._ensure_rows(self.num_rows + copies)
        rows = slice(self.num_rows, self.num_rows + copies)
        for layer, (k, v) in enumerate(kv):
            self.keys[layer][rows, :, self.cursor - L : self.cursor] = k
            self.values[layer][rows, :, self.cursor - L : self.cursor] = v
        self.start[rows] = self.cursor - L
        self.num_rows += copies

    def remove(self, finished: list[int]) -> Tensor:
        """Drop the rows `finished`; return `order` [n'] such that new row i was old row order[i].

        Survivors beyond the new end move into the holes (one row copy per hole, not a compaction).
        """
        n = self.num_rows
        gone = set(finished)
        new_n = n - len(gone)
        holes = sorted(r for r in gone if r < new_n)
        movers = [r for r in range(new_n, n) if r not in gone]
        order = torch.arange(new_n)
        if holes:
            lo = self.span_start
            src, dst = torch.tensor(movers), torch.tensor(holes)
            for buffers in (self.keys, self.values):
                for buf in buffers:
                    buf[dst, :, lo : self.cursor] = buf[src, :, lo : self.cursor]
            self.start[dst] = self.start[src]
            order[dst] = src
        self.num_rows = new_n
        return order

    def row_kv(self, row: int) -> KV:
        """A copy of one row's live KV (its own columns only), e.g. to keep a session's prefix."""
        s = int(self.start[row])
        return [
            (k[row : row + 1, :, s : self.cursor].clone(), v[row : row + 1, :, s : self.cursor].clone())
            for k, v in zip(self.keys, self.values, strict=True)
        ]

    # --- room ------------------------------------------------------------------------------------
    def ensure_columns(self, extra: int) -> None:
        """Make room to write `extra` more columns, first by dropping dead columns on the left."""
        C = self.keys[0].shape[2]
        if self.cursor + extra <= C:
            return
        span = self.cursor - self.span_start
        columns = C if span + extra <= C * 3 // 4 else max(2 * C, span + extra)
        self._relayout(rows=self.keys[0].shape[0], columns=columns, shift=-self.span_start)

    def reserve_rows(self, rows: int) -> None:
        """Room for `rows` running rows at once (one growth for a whole admission, not several)."""
        if not self.keys:
            self._initial = (max(self._initial[0], rows), self._initial[1])
        else:
            self._ensure_rows(rows)

    def _ensure_rows(self, rows: int) -> None:
        R = self.keys[0].shape[0]
        if rows > R:
            self._relayout(rows=max(rows, 2 * R), columns=self.keys[0].shape[2], shift=0)

    def _allocate(self, kv: KV, rows: int, columns: int) -> None:
        def empty(t: Tensor) -> Tensor:
            return torch.zeros((rows, t.shape[1], columns, t.shape[3]), dtype=t.dtype, device=t.device)

        self.keys = [empty(k) for k, _ in kv]
        self.values = [empty(v) for _, v in kv]
        self.start = torch.zeros(rows, dtype=torch.int64, device=kv[0][0].device)

    def _relayout(self, rows: int, columns: int, shift: int) -> None:
        """New buffers of [rows, H, columns, D]; live columns move by `shift` (+ right, - left)."""
        n, lo, c = self.num_rows, self.span_start, self.cursor
        for buffers in (self.keys, self.values):
            for i, old in enumerate(buffers):
                new = old.new_zeros((rows, old.shape[1], columns, old.shape[3]))
                new[:n, :, lo + shift : c + shift] = old[:n, :, lo:c]
                buffers[i] = new
        start = torch.zeros(rows, dtype=torch.int64, device=self.start.device)
        start[:n] = self.start[:n] + shift
        self.start, self.cursor = start, c + shift
