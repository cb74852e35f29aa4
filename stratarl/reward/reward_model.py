"""Layer 5, rewards: learned reward models — an HF sequence-classification model read at the last token,
or a causal-LM judge (`CausalLMJudge`) read as P(yes) of its next token.

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


class CausalLMJudge:
    """A causal LM asked whether a response is good: score = P(yes) / (P(yes) + P(no)) for the next token.

    The judge reads `template` filled with the conversation's last user message (`{prompt}`) and the
    response (`{response}`), as a user message of its chat template when its tokenizer has one (with
    the generation prompt), else as plain text. `yes` and `no` must each be one token of the judge's
    vocabulary, so the two probabilities are read from one forward pass, without sampling.
    """

    def __init__(
        self, model: nn.Module, tokenizer: Any, *, template: str, yes: str, no: str, batch_size: int = 8
    ) -> None:
        self.model, self.tokenizer, self.template, self.batch_size = (
            model.eval(),
            tokenizer,
            template,
            batch_size,
        )
        self.verdict_ids = [self._single_token(word) for word in (yes, no)]

    def _single_token(self, word: str) -> int:
        ids = self.tokenizer.encode(word, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(
                f"judge verdict {word!r} is {len(ids)} tokens in the judge's tokenizer {ids}; choose a word "
                "that is exactly one token (reward.model.judge_yes / judge_no)"
            )
        return int(ids[0])

    def judge_ids(self, conversation: Sequence[dict[str, Any]]) -> list[int]:
        """The judge's prompt tokens for one conversation ending in the response to judge."""
        *context, response = conversation
        prompt = next((m["content"] for m in reversed(context) if m.get("role") == "user"), "")
        text = self.template.format(prompt=prompt, response=response["content"])
        if getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}],
                tokenize=True,
                add_generation_prompt=True,
                return_dict=False,
            )
            return [int(t) for t in ids]
        return [int(t) for t in self.tokenizer.encode(text)]

    @torch.no_grad()
    def score_conversations(self, conversations: Sequence[list[dict[str, Any]]]) -> Tensor:
        """[N] P(yes | judge prompt) among {yes, no}."""
        rows = [self.judge_ids(c) for c in conversations]
        device = next(self.model.parameters()).device
        scores = []
        for lo in range(0, len(rows), self.batch_size):
            chunk = rows[lo : lo + self.batch_size]
            L = max(len(r) for r in chunk)
            ids = torch.zeros((len(chunk), L), dtype=torch.int64)
            mask = torch.zeros((len(chunk), L), dtype=torch.int64)
            for i, row in enumerate(chunk):  # left-padded: every row's last token is at L - 1
                ids[i, L - len(row) :], mask[i, L - len(row) :] = torch.tensor(row), 1
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = self.model(
                input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device)
            ).logits[:, -1]  # [n, V]
            verdict = logits[:, self.verdict_ids].float().log_softmax(-1)  # [n, 2]
            scores.append(verdict[:, 0].exp().cpu())
        return torch.cat(scores)


REWARD_MODEL_KINDS = ("sequence_classification", "causal_lm_judge")


def load_reward_model(
    path: str,
    *,
    kind: str,
    tokenizer_path: str = "",
    dtype: str = "float32",
    batch_size: int = 8,
    judge_template: str = "",
    judge_yes: str = "yes",
    judge_no: str = "no",
    device: str = "cpu",
) -> SequenceRewardModel | CausalLMJudge:
    """A reward model from a local HF directory: `kind` is one of `REWARD_MODEL_KINDS`."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    if kind not in REWARD_MODEL_KINDS:
        raise ValueError(f"reward model kind must be one of {REWARD_MODEL_KINDS}, got {kind!r}")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path or path)
    torch_dtype = getattr(torch, dtype)
    if kind == "sequence_classification":
        model = AutoModelForSequenceClassification.from_pretrained(
            path, num_labels=1, torch_dtype=torch_dtype
        )
        return SequenceRewardModel(model.to(device), tokenizer, batch_size=batch_size)
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch_dtype)
    return CausalLMJudge(
        model.to(device),
        tokenizer,
        template=judge_template,
        yes=judge_yes,
        no=judge_no,
        batch_size=batch_size,
    )
