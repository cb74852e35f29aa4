"""Layer 5, rollout: the first generation backend, batched KV-cache decoding on a HF causal LM.

The decode loop is ours (the model's forward with a KV cache, not `model.generate`) so that
log-probs follow the rule of `stratarl.rollout.sampling` and the loop can later grow into continuous
batching. Prompts are left-padded; rows that finish (EOS/stop id or max_tokens) leave the running
batch and its KV cache. Static batching for now: one decode per call, chunked at `max_num_seqs`.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from transformers import DynamicCache

from stratarl.rollout.interface import FinishReason, GenerationRequest, GenerationResult
from stratarl.rollout.sampling import RowSampling, draw_uniforms, next_tokens
from stratarl.rollout.weight_sync import WeightLoadReport, WeightSyncError, load_in_place


def left_pad(sequences: Sequence[Sequence[int]], pad_token_id: int) -> tuple[Tensor, Tensor]:
    """(ids [n, P], attention_mask [n, P]) with every sequence aligned to the right edge."""
    P = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), P), pad_token_id, dtype=torch.int64)
    mask = torch.zeros((len(sequences), P), dtype=torch.int64)
    for i, s in enumerate(sequences):
        ids[i, P - len(s) :] = torch.tensor(s, dtype=torch.int64)
        mask[i, P - len(s) :] = 1
    return ids, mask


@dataclass
class _RunningRows:
    """Per-row decode state of the rows still generating (n of them), indexed like the KV cache."""

    index: Tensor  # [n] position of the row in the request list
    attention_mask: Tensor  # [n, P + t]
    last_position: Tensor  # [n] position id of the last token fed
    sampling: RowSampling
    stop_ids: Tensor  # [n, S] EOS + the request's stop ids, padded with -1
    max_tokens: Tensor  # [n]
    generators: list[torch.Generator | None]

    def keep(self, rows: Tensor) -> _RunningRows:
        return _RunningRows(
            index=self.index[rows],
            attention_mask=self.attention_mask[rows],
            last_position=self.last_position[rows],
            sampling=self.sampling.select(rows),
            stop_ids=self.stop_ids[rows],
            max_tokens=self.max_tokens[rows],
            generators=[self.generators[i] for i in rows.tolist()],
        )


class _Transcript:
    """What each request has generated so far, in request order."""

    def __init__(self, num_requests: int) -> None:
        self.tokens: list[list[int]] = [[] for _ in range(num_requests)]
        self.log_probs: list[list[float]] = [[] for _ in range(num_requests)]
        self.reasons: list[FinishReason] = ["length"] * num_requests

    def record(self, index: Tensor, tokens: Tensor, log_probs: Tensor, stopped: Tensor) -> None:
        for i, token, log_prob in zip(index.tolist(), tokens.tolist(), log_probs.tolist(), strict=True):
            self.tokens[i].append(token)
            self.log_probs[i].append(log_prob)
        for i in index[stopped].tolist():
            self.reasons[i] = "stop"

    def results(self, requests: Sequence[GenerationRequest], version: int) -> list[GenerationResult]:
        return [
            GenerationResult(
                request_id=r.request_id,
                prompt_ids=tuple(r.prompt_ids),
                response_ids=tuple(self.tokens[i]),
                log_probs=tuple(self.log_probs[i]),
                finish_reason=self.reasons[i],
                weight_version=version,
            )
            for i, r in enumerate(requests)
        ]


class TorchRolloutEngine:
    """A `RolloutEngine` over an in-process HF causal LM (any `AutoModelForCausalLM`).

    eos_token_ids: ids that end every request (the tokenizer's EOS, e.g. `<|im_end|>`).
    pad_token_id: fills left padding inside the engine (never visible in results).
    seed: seeds the shared generator used by requests without their own seed.
    max_num_seqs: the most sequences decoded together; longer request lists run in chunks.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        eos_token_ids: int | Sequence[int],
        pad_token_id: int,
        seed: int | None = None,
        max_num_seqs: int = 256,
    ) -> None:
        self.model = model
        self.eos_token_ids = (eos_token_ids,) if isinstance(eos_token_ids, int) else tuple(eos_token_ids)
        self.pad_token_id = pad_token_id
        self.max_num_seqs = max_num_seqs
        self._shared_generator = torch.Generator()
        if seed is None:
            self._shared_generator.seed()
        else:
            self._shared_generator.manual_seed(seed)
        self._weight_version = 0
        # transformers 5.24 names the KV-cache argument `cache` (`past_key_values` is deprecated there);
        # older releases only know `past_key_values`.
        forward_args = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in forward_args else "past_key_values"

    @property
    def weight_version(self) -> int:
        return self._weight_version

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def load_weights(self, state_dict: Mapping[str, Tensor], version: int) -> WeightLoadReport:
        """Load the trainer's weights in place (strict keys, verified) and serve them as `version`."""
        if version <= self._weight_version:
            raise WeightSyncError(
                f"weight version must increase: serving {self._weight_version}, asked to load {version}"
            )
        report = load_in_place(self.model, state_dict, version)
        self._weight_version = version
        return report

    @torch.inference_mode()
    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        # eval mode while generating, then back: the module may be shared with a trainer in-process
        was_training = self.model.training
        self.model.eval()
        try:
            results: list[GenerationResult] = []
            for start in range(0, len(requests), self.max_num_seqs):
                results.extend(self._generate_batch(requests[start : start + self.max_num_seqs]))
        finally:
            self.model.train(was_training)
        return results

    def _generate_batch(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        version = self._weight_version
        rows, cache, logits = self._prefill(requests)
        transcript = _Transcript(len(requests))
        for step in range(int(rows.max_tokens.max())):
            uniforms = draw_uniforms(rows.generators, self._shared_generator, self.device)
            tokens, log_probs = next_tokens(logits, rows.sampling, uniforms)  # [n], [n]
            stopped = (tokens[:, None] == rows.stop_ids).any(dim=-1)  # [n]
            transcript.record(rows.index, tokens, log_probs, stopped)
            running = ~stopped & (rows.max_tokens > step + 1)
            if not running.any():
                break
            if not running.all():  # finished rows leave the batch and the KV cache
                kept = running.nonzero().squeeze(-1)
                cache.batch_select_indices(kept)
                rows, tokens = rows.keep(kept), tokens[kept]
            logits = self._decode_step(rows, cache, tokens)
        return transcript.results(requests, version)

    def _prefill(self, requests: Sequence[GenerationRequest]) -> tuple[_RunningRows, DynamicCache, Tensor]:
        """Run the left-padded prompts through the model; return the row state, cache and logits [n, V]."""
        device = self.device
        ids, mask = left_pad([r.prompt_ids for r in requests], self.pad_token_id)
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)  # [n, P]
        cache = DynamicCache(config=self.model.config)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kwarg: cache},
        )
        stops = [self.eos_token_ids + r.sampling.stop_token_ids for r in requests]
        S = max(len(s) for s in stops)
        stop_ids = [list(s) + [-1] * (S - len(s)) for s in stops]  # -1 never matches a token
        rows = _RunningRows(
            index=torch.arange(len(requests), device=device),
            attention_mask=mask,
            last_position=positions[:, -1],
            sampling=RowSampling.from_params([r.sampling for r in requests], device),
            stop_ids=torch.tensor(stop_ids, dtype=torch.int64, device=device).reshape(len(requests), S),
            max_tokens=torch.tensor([r.sampling.max_tokens for r in requests], device=device),
            generators=[_request_generator(r) for r in requests],
        )
        return rows, cache, out.logits[:, -1]  # the cache was filled in place

    def _decode_step(self, rows: _RunningRows, cache: DynamicCache, tokens: Tensor) -> Tensor:
        """Feed each running row its last sampled token; return the next logits [n, V]."""
        ones = torch.ones_like(rows.attention_mask[:, :1])
        rows.attention_mask = torch.cat([rows.attention_mask, ones], dim=-1)  # [n, P + t]
        rows.last_position = rows.last_position + 1
        out = self.model(
            input_ids=tokens[:, None],
            attention_mask=rows.attention_mask,
            position_ids=rows.last_position[:, None],
            use_cache=True,
            **{self._cache_kwarg: cache},
        )
        return out.logits[:, -1]


def _request_generator(request: GenerationRequest) -> torch.Generator | None:
    if request.sampling.seed is None:
        return None
    return torch.Generator().manual_seed(request.sampling.seed)
