"""Layer 5, agent loops: does the token stream we built equal what the chat template renders?

After an episode, the full conversation (prompt messages, each assistant turn's decoded text, each
observation message) is rendered with `apply_chat_template` and tokenized in one piece, then
compared with `prompt_ids + response_ids`. Where the template is prefix-preserving and the model's
tokens are the tokenizer's canonical encoding of its text, the two agree token for token (ours ends
at the last EOS; the template may add a closing suffix). Where they do not — a template that rewrites
earlier turns (e.g. drops reasoning), or a model that sampled a non-canonical tokenization — the
report says where, which is exactly the drift that re-tokenizing frameworks would train on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stratarl.agent.rendering import encode, render_text
from stratarl.agent.trajectory import Trajectory


@dataclass(frozen=True)
class TemplateComparison:
    """agrees: our ids are a prefix of the template's; first_mismatch: position of the first difference
    (None when agreeing); suffix: template ids after ours (the closing text, when agreeing)."""

    agrees: bool
    ours: list[int]
    template: list[int]
    first_mismatch: int | None
    context: str  # a few decoded tokens around the first mismatch, ours vs template

    @property
    def suffix(self) -> list[int]:
        return self.template[len(self.ours) :] if self.agrees else []


def compare_with_template(tokenizer: Any, trajectory: Trajectory) -> TemplateComparison:
    """Compare the trajectory's ids with the template's rendering of its messages (prompt included)."""
    rendered = render_text(tokenizer, trajectory.messages, add_generation_prompt=False)
    template = encode(tokenizer, rendered)
    ours = list(trajectory.prompt_ids) + list(trajectory.response_ids)
    mismatch = next((i for i, (a, b) in enumerate(zip(ours, template, strict=False)) if a != b), None)
    if mismatch is None and len(ours) > len(template):
        mismatch = len(template)
    context = ""
    if mismatch is not None:
        lo = max(mismatch - 3, 0)
        context = (
            f"ours {tokenizer.decode(ours[lo : mismatch + 3])!r} vs "
            f"template {tokenizer.decode(template[lo : mismatch + 3])!r}"
        )
    return TemplateComparison(mismatch is None, ours, template, mismatch, context)
