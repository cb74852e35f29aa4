"""A real `RolloutEngine` whose replies are scripted text, for exact state-machine tests.

Each episode (request ids look like "<episode>/<turn>") has a list of replies; turn k returns the
k-th reply encoded with the tokenizer plus EOS, log-prob of token j = −(j+1)/100, weight version as
set. A reply longer than the request's max_tokens is cut and finishes with "length"; a reply
wrapped as `NoEos("...")` finishes without EOS ("length"). Every call is recorded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from stratarl.rollout.interface import GenerationRequest, GenerationResult


class NoEos(str):
    """A scripted reply the model does not close with EOS."""


class ScriptedEngine:
    def __init__(self, tokenizer, replies: Mapping[str, Sequence[str]], *, weight_version: int = 0) -> None:
        self.tokenizer = tokenizer
        self.replies = {k: list(v) for k, v in replies.items()}
        self._weight_version = weight_version
        self.calls: list[list[GenerationRequest]] = []

    @property
    def weight_version(self) -> int:
        return self._weight_version

    def load_weights(self, state_dict, version: int) -> None:
        self._weight_version = version

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        self.calls.append(list(requests))
        return [self._reply(r) for r in requests]

    def _reply(self, request: GenerationRequest) -> GenerationResult:
        episode, turn = request.request_id.rsplit("/", 1)
        text = self.replies[episode][int(turn)]
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        closes = not isinstance(text, NoEos)
        if closes:
            ids = [*ids, self.tokenizer.eos_token_id]
        finish = "stop" if closes else "length"
        if len(ids) > request.sampling.max_tokens:
            ids, finish = ids[: request.sampling.max_tokens], "length"
        return GenerationResult(
            request_id=request.request_id,
            prompt_ids=tuple(request.prompt_ids),
            response_ids=tuple(ids),
            log_probs=tuple(-(j + 1) / 100 for j in range(len(ids))),
            finish_reason=finish,
            weight_version=self._weight_version,
        )
