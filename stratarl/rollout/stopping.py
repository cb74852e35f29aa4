"""Layer 5, rollout: when one request stops — EOS/stop token ids, stop strings, max tokens.

Checked after every sampled token, in this order: the token is an EOS or stop id ("stop", reason =
the id); the decoded tail of the response contains a stop string ("stop", reason = the string); the
response reached max_tokens, or prompt + response fill the model's context ("length"). The
stopping token is kept in the response, so a stop token sampled at the last allowed step finishes
with "stop". With `ignore_eos` the EOS ids are not stop ids; before `min_tokens` tokens only the
length can end a response, and `banned_ids` names the stop ids the sampler must not draw yet.

Stop strings are searched in the decoded text of the last `len(longest stop) + 4` response tokens
only, which holds any stop string that the newest token completed as long as tokens decode to at
least one character each (true of byte-level BPE, where a partial UTF-8 byte decodes to U+FFFD).
Searching a bounded tail keeps the cost per step constant instead of growing with the response.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from stratarl.rollout.interface import FinishReason, SamplingParams

Detokenize = Callable[[Sequence[int]], str]

TAIL_EXTRA_TOKENS = 4


class StopRule:
    """The stopping rule of one request: the engine's EOS ids plus the request's own conditions."""

    def __init__(
        self,
        sampling: SamplingParams,
        eos_token_ids: Sequence[int],
        detokenize: Detokenize | None,
        *,
        context_budget: int | None = None,
    ):
        if sampling.stop and detokenize is None:
            raise ValueError(
                f"stop strings {sampling.stop!r} need a detokenizer: build the engine with "
                "detokenize=tokenizer.decode"
            )
        eos = frozenset() if sampling.ignore_eos else frozenset(eos_token_ids)
        self.stop_ids = eos | frozenset(sampling.stop_token_ids)
        self.min_tokens = sampling.min_tokens
        self.strings = sampling.stop
        # context_budget: context length left after the prompt (vLLM caps max_tokens the same way)
        self.max_tokens = (
            sampling.max_tokens if context_budget is None else min(sampling.max_tokens, context_budget)
        )
        self.tail = max((len(s) for s in self.strings), default=0) + TAIL_EXTRA_TOKENS
        self.detokenize = detokenize

    def banned_ids(self, num_generated: int) -> frozenset[int]:
        """Token ids the next draw must not pick: the stop ids while fewer than min_tokens exist."""
        return self.stop_ids if num_generated < self.min_tokens else frozenset()

    def check(self, response: Sequence[int]) -> tuple[FinishReason, int | str | None] | None:
        """(finish_reason, stop_reason) if `response`, whose last token was just sampled, is done."""
        if len(response) < self.min_tokens and len(response) < self.max_tokens:
            return None
        token = response[-1]
        if token in self.stop_ids:
            return "stop", token
        if self.strings:
            text = self.detokenize(response[-self.tail :])
            for s in self.strings:
                if s in text:
                    return "stop", s
        if len(response) >= self.max_tokens:
            return "length", None
        return None
