"""Layer 5, rewards: a learned reward model — any HF sequence-classification model, read at the last token.

The score of a sequence is the classification head applied to the hidden state of its LAST REAL
token (the last position where attention_mask is 1), whatever the padding side. We take that
position ourselves instead of relying on the model's own pooling, which finds the end of a sequence
by looking for `pad_token_id` and so goes wrong when pad and EOS share an id. Conversations are
rendered with the reward model's own tokenizer and chat template (it may differ from the policy's),
as verl's RewardModelWorker does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn


def last_token_index(attention_mask: Tensor) -> Tensor:
    """[N] position of the last 1 in each row of attention_mask [N, L] (0 for an empty row)."""
    L = attention_mask.shape[1]
    return L - 1 - attention_mask.flip(-1).to(torch.int64).argmax(dim=-1)


class SequenceRewardModel:
    """model: an `AutoModelForSequenceClassification` (label 0 is the reward); tokenizer: its own."""

    def __init__(self, model: nn.Module, tokenizer: Any = None, *, batch_size: int = 8) -> None:
        self.model, self.tokenizer, self.batch_size = model.eval(), tokenizer, batch_size
        self.head = next((getattr(model, n) for n in ("score", "classifier") if hasattr(model, n)), None)
        if self.head is None:
            raise TypeError(f"{type(model).__name__} has no `score` or `classifier` head")

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def score_ids(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """[N] rewards for padded token ids [N, L] (either padding side)."""
        scores = []
        for lo in range(0, input_ids.shape[0], self.batch_size):
            ids = input_ids[lo : lo + self.batch_size].to(self.device)
            mask = attention_mask[lo : lo + self.batch_size].to(self.device)
            positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
            hidden = self.model.base_model(input_ids=ids, attention_mask=mask, position_ids=positions)[0]
            last = hidden[torch.arange(ids.shape[0], device=ids.device), last_token_index(mask)]  # [n, H]
            scores.append(self.head(last)[:, 0].float().cpu())
        return torch.cat(scores)

    def score_conversations(self, conversations: Sequence[list[dict[str, Any]]]) -> Tensor:
        """[N] rewards of whole conversations (prompt + response messages), templated for this model."""
        if self.tokenizer is None:
            raise ValueError("score_conversations needs the reward model's tokenizer")
        rows = [
            [int(t) for t in self.tokenizer.apply_chat_template(list(c), tokenize=True, return_dict=False)]
            for c in conversations
        ]
        L = max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.full((len(rows), L), pad, dtype=torch.int64)
        mask = torch.zeros((len(rows), L), dtype=torch.int64)
        for i, row in enumerate(rows):
            ids[i, L - len(row) :] = torch.tensor(row)
            mask[i, L - len(row) :] = 1
        return self.score_ids(ids, mask)
