"""Layer 5, agent loops: turn observation messages into token ids once, with the chat template.

Token-in/token-out: the model's turns are kept as the exact sampled ids and never re-tokenized;
what the loop appends after a turn (tool results, a simulated user's reply) is rendered here, once,
and its ids appended with response_mask 0. The observation's text is the template's own, found by
difference: render a fixed reference conversation `[user, assistant]`, render it again with the
new messages and the generation prompt, and keep what was added (so a default system prompt is
never repeated, as verl's `remove_system_prompt`). Before that comes the "bridge": whatever the
template writes after an assistant turn's EOS token (ChatML writes "\\n" after `<|im_end|>`), which
the model never samples.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

_REFERENCE_USER = "reference question"
_MARKER = "REFERENCE_ASSISTANT_CONTENT"


def encode_plain(tokenizer: Any, text: str) -> list[int]:
    """Token ids of message text: a special token's text in it is split like any other characters."""
    return [int(t) for t in tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)]


class TemplateError(ValueError):
    """The chat template cannot be rendered incrementally (not prefix-preserving for new messages)."""


def render_text(
    tokenizer: Any, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool, **kwargs
) -> str:
    return tokenizer.apply_chat_template(
        list(messages), add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs
    )


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of template text: special tokens in the text map to their ids, nothing added."""
    return [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]


class ChatRenderer:
    """Observation rendering for one tokenizer; `eos_token_id` is what ends an assistant turn."""

    def __init__(self, tokenizer: Any, *, eos_token_id: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.eos_token_id = int(tokenizer.eos_token_id if eos_token_id is None else eos_token_id)
        self._reference = [
            {"role": "user", "content": _REFERENCE_USER},
            {"role": "assistant", "content": _MARKER},
        ]
        self._reference_text = render_text(tokenizer, self._reference, add_generation_prompt=False)
        after = self._reference_text[self._reference_text.rindex(_MARKER) + len(_MARKER) :]
        eos_text = tokenizer.decode([self.eos_token_id], skip_special_tokens=False)
        # The text the template puts after the EOS the model sampled; all of it when the template
        # closes an assistant turn with something other than the EOS token.
        self.bridge_text = after[len(eos_text) :] if after.startswith(eos_text) else after
        self.closes_with_eos = after.startswith(eos_text)
        self._special_texts = tuple(
            token.content
            for token in getattr(tokenizer, "added_tokens_decoder", {}).values()
            if token.special
        ) + tuple(tokenizer.all_special_tokens)

    def prompt_ids(self, messages: Sequence[dict[str, Any]], tools: list[dict] | None = None) -> list[int]:
        """The prompt with the generation prompt, tokenized in one call (tools passed to the template)."""
        kwargs = {"tools": tools} if tools else {}
        return encode(
            self.tokenizer, render_text(self.tokenizer, messages, add_generation_prompt=True, **kwargs)
        )

    def observation_text(self, messages: Sequence[dict[str, Any]], *, after_eos: bool = True) -> str:
        """The template text of `messages` following an assistant turn, up to the next generation prompt."""
        full = render_text(self.tokenizer, [*self._reference, *messages], add_generation_prompt=True)
        if not full.startswith(self._reference_text):
            raise TemplateError(
                "the chat template is not prefix-preserving: rendering more messages changed the text "
                f"of earlier ones (roles {[m.get('role') for m in messages]})"
            )
        return (self.bridge_text if after_eos else "") + full[len(self._reference_text) :]

    def observation_ids(self, messages: Sequence[dict[str, Any]], *, after_eos: bool = True) -> list[int]:
        """`observation_text` as token ids (tokenized once; appended with response_mask 0). A message
        whose text holds a special token's text is tokenized on its own, as plain text, between the
        template's pieces; other observations are tokenized whole (the same ids as the template text)."""
        if not any(self._holds_special_text(m) for m in messages):
            return encode(self.tokenizer, self.observation_text(messages, after_eos=after_eos))
        holders = {
            i: f"STRATARL{uuid.uuid4().hex}"
            for i, m in enumerate(messages)
            if isinstance(m.get("content"), str)
        }
        marked = [{**m, "content": holders[i]} if i in holders else m for i, m in enumerate(messages)]
        rest = self.observation_text(marked, after_eos=after_eos)
        ids: list[int] = []
        for i, holder in holders.items():
            before, found, rest = rest.partition(holder)
            if not found:
                raise TemplateError(
                    f"the chat template changed the text of a {messages[i].get('role')} message"
                )
            ids += encode(self.tokenizer, before) + encode_plain(self.tokenizer, messages[i]["content"])
        return ids + encode(self.tokenizer, rest)

    def _holds_special_text(self, message: dict[str, Any]) -> bool:
        content = message.get("content")
        return isinstance(content, str) and any(text in content for text in self._special_texts)

    def assistant_text(self, token_ids: Sequence[int]) -> str:
        """An assistant turn's text for the message history: the sampled ids decoded, EOS removed."""
        ids = list(token_ids)
        if ids and ids[-1] == self.eos_token_id:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)
