"""Layer 5, rollout: the engine interface every generation backend implements.

Token ids in, token ids out: a `GenerationRequest` carries prompt ids, `SamplingParams` and an
optional session id (every turn of one trajectory shares it); a `GenerationResult` carries the
sampled response ids, the log-prob of each sampled token (the rule is in `stratarl.rollout.sampling`),
why generation stopped, and where it came from: replica, sampling params and weight version.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

import torch

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token of one request.

    temperature: 0 means greedy (argmax of the raw logits); > 0 divides the logits before sampling.
    top_p: nucleus sampling, keep the smallest set of tokens whose probability reaches top_p (1 = off).
    top_k: keep the k most likely tokens (0 or -1 = off; HF spells "off" 0, vLLM/verl spell it -1).
    max_tokens: the most response tokens to generate (the stop token, if any, counts as one).
    stop_token_ids: extra ids that end generation, besides the engine's EOS ids; the stop token is
        kept in the response as the last action token.
    stop: strings that end generation once the decoded response contains one; the token that
        completes it is kept whole (tokens are never split), so the decoded response ends with the
        stop string or with it plus the rest of that token. Needs an engine built with `detokenize`.
    seed: a request with a seed draws its randomness from its own torch.Generator, so the same
        prompt and seed give the same response whatever else is in the batch; None draws from the
        engine's generator. Give each of a prompt's n samples its own seed, or they are identical.
    ignore_eos: the engine's EOS ids do not end the response (an EOS sampled is kept as an ordinary
        token); stop_token_ids and stop strings still do (vLLM's `ignore_eos`).
    min_tokens: no response ends before this many tokens: until then the EOS and stop ids are never
        sampled and stop strings are not checked (vLLM's `min_tokens`). With ignore_eos, or with
        min_tokens = max_tokens, every response has exactly max_tokens tokens (fixed-length runs).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    min_tokens: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"SamplingParams.top_k must be >= -1 (0 or -1 = off), got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be >= 1, got {self.max_tokens}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"SamplingParams.min_tokens must be in [0, max_tokens={self.max_tokens}], "
                f"got {self.min_tokens}"
            )
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        if any(not s for s in self.stop):
            raise ValueError(f"SamplingParams.stop strings must be non-empty, got {self.stop!r}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        object.__setattr__(self, "stop", tuple(str(s) for s in self.stop))

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt to complete: its id (echoed in the result), prompt token ids and sampling params.

    session_id: the trajectory this turn belongs to. A router sends every turn of a session to the
    same replica, and the torch engine keeps the session's KV cache so that the next turn, whose
    prompt extends this one's prompt + response, prefills only the new tokens.
    """

    request_id: str
    prompt_ids: Sequence[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    session_id: str | None = None

    def __post_init__(self) -> None:
        if len(self.prompt_ids) == 0:
            raise ValueError(f"request {self.request_id!r} has an empty prompt")
        object.__setattr__(self, "prompt_ids", tuple(int(t) for t in self.prompt_ids))


@dataclass(frozen=True)
class GenerationResult:
    """One completed request.

    response_ids and log_probs have the same length T_i >= 1: log_probs[t] is the log-prob of
    response_ids[t] under the rule documented in `stratarl.rollout.sampling`. finish_reason is
    "stop" when an EOS/stop id or stop string ended it (`stop_reason` says which) and "length" when
    max_tokens ran out. Provenance: `token_versions[t]`, the weight version that sampled token t
    (non-decreasing; more than one version only when weights loaded while the request ran, partial
    rollout `continue`; empty at construction means every token came from `weight_version`);
    `weight_version`, the oldest of them (what staleness is measured from); `replica_id` of the
    engine that served it, the `sampling` params it ran with, and `num_cached_tokens`, the prompt
    tokens whose KV came from a cache (prefix sharing) instead of a prefill.
    """

    request_id: str
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    log_probs: tuple[float, ...]
    finish_reason: FinishReason
    weight_version: int
    stop_reason: int | str | None = None
    sampling: SamplingParams | None = None
    replica_id: int = 0
    num_cached_tokens: int = 0
    token_versions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if len(self.response_ids) != len(self.log_probs):
            raise ValueError(
                f"result {self.request_id!r}: {len(self.response_ids)} response ids but "
                f"{len(self.log_probs)} log-probs"
            )
        versions = tuple(int(v) for v in self.token_versions) or (self.weight_version,) * len(self.log_probs)
        object.__setattr__(self, "token_versions", versions)
        oldest = min(versions, default=self.weight_version)
        if len(versions) != len(self.response_ids) or oldest != self.weight_version:
            raise ValueError(
                f"result {self.request_id!r}: {len(versions)} token versions {versions[:8]} for "
                f"{len(self.response_ids)} response ids of weight_version {self.weight_version}"
            )
        if any(a > b for a, b in itertools.pairwise(versions)):
            raise ValueError(f"result {self.request_id!r}: token versions go back in time: {versions}")


@runtime_checkable
class RolloutEngine(Protocol):
    """What the rest of the system may ask of a generation backend (torch, vLLM, a router)."""

    @property
    def weight_version(self) -> int:
        """The version of the weights now served (0 = the weights the engine was built with)."""
        ...

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Complete every request; results come back in request order."""
        ...

    async def generate_async(self, request: GenerationRequest) -> GenerationResult:
        """Complete one request without blocking the event loop (many sessions run at once)."""
        ...

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> object:
        """Replace the served weights in place and serve them as `version` (> the current one)."""
        ...
