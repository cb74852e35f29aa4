"""Layer 5, rollout: the torch engine's step loop — continuous batching with prefix sharing.

One `step()`:
  1. admit waiting requests while there are free rows (`max_num_seqs`) and prefill budget
     (`max_prefill_tokens`, prompt tokens actually computed). Identical prompts admitted together
     are prefilled once; a prompt already in the `PrefixStore` is not prefilled at all; a session's
     next turn prefills only the tokens after its cached prefix. The prefix KV is copied into one
     row per request, and the prompt's last logits serve every copy's first token.
  2. sample one token for every running row (`stratarl.rollout.sampling`), check its stop rule;
  3. finished rows leave the batch and the KV cache (and a session's KV is kept for its next turn);
  4. one decode forward for the rows still running gives the next logits.
So a finished sequence stops costing compute at once, and a waiting one joins at the next step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from stratarl.rollout.decode_attention import decode_attention
from stratarl.rollout.engine_loop import Finished
from stratarl.rollout.fused_decode import FusedDecoder
from stratarl.rollout.interface import FinishReason, GenerationRequest, GenerationResult
from stratarl.rollout.kv_cache import PrefillCache, SlotKVCache
from stratarl.rollout.prefix_store import Prefix, PrefixStore
from stratarl.rollout.sampling import RowSampling, banned_tokens, draw_uniforms, next_tokens
from stratarl.rollout.stopping import StopRule


@dataclass
class _Row:
    """A running sequence: its request, where its result goes, and what it has generated."""

    request: GenerationRequest
    future: Future
    rule: StopRule
    generator: torch.Generator | None
    next_position: int  # position id of the next token fed
    num_cached: int
    versions: list[tuple[int, int]]  # (index of the first token, weight version) of each stretch
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)

    def token_versions(self) -> tuple[int, ...]:
        """The weight version that sampled each token (one stretch unless weights loaded mid-row)."""
        ends = [start for start, _ in self.versions[1:]] + [len(self.tokens)]
        stretches = zip(self.versions, ends, strict=True)
        return tuple(v for (start, v), end in stretches for _ in range(end - start))


@dataclass
class _Admission:
    """The requests admitted in one step, grouped by how their prefix KV is obtained."""

    fresh: dict[tuple[int, ...], list[tuple[GenerationRequest, Future]]] = field(default_factory=dict)
    cached: list[tuple[Prefix, list[tuple[GenerationRequest, Future]]]] = field(default_factory=list)
    extend: list[tuple[Prefix, GenerationRequest, Future]] = field(default_factory=list)


class EngineCore:
    """Scheduling and model calls of `TorchRolloutEngine` (which adds threads, async and weight sync)."""

    def __init__(
        self,
        model: nn.Module,
        *,
        make_rule: Callable[[GenerationRequest], StopRule],
        pad_token_id: int,
        shared_generator: torch.Generator,
        max_num_seqs: int,
        max_prefill_tokens: int,
        prefix_cache_tokens: int,
        replica_id: int,
        cache_kwarg: str,
        fused: FusedDecoder | None = None,
    ) -> None:
        self.model, self.make_rule, self.pad_token_id = model, make_rule, pad_token_id
        self.fused = fused  # our decode step (fused_decode.py), or None: the model's forward decodes
        self.shared_generator, self.replica_id = shared_generator, replica_id
        self.cache_kwarg = cache_kwarg  # the name the model's forward gives its KV-cache argument
        self.max_num_seqs, self.max_prefill_tokens = max_num_seqs, max_prefill_tokens
        self.waiting: deque[tuple[GenerationRequest, Future]] = deque()
        self.rows: list[_Row] = []
        self.logits: Tensor | None = None  # [n, V] next-token logits of the running rows
        self.cache = SlotKVCache()
        self.store = PrefixStore(prefix_cache_tokens)
        self.version = 0
        self.admission_paused = False
        self.prefilled_tokens = 0  # prompt tokens actually run through the model (a metric)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def can_step(self) -> bool:
        return bool(self.rows) or (bool(self.waiting) and not self.admission_paused)

    @torch.inference_mode()
    def step(self) -> Finished:
        self._admit()
        if not self.rows:
            return []
        tokens, finished = self._sample_and_retire()
        if self.rows:
            self._decode(tokens)
        else:
            self.logits = None
        return finished

    def fail_all(self, error: BaseException) -> None:
        """A step raised: every queued and running request gets the error; the state starts afresh."""
        for _, future in self.waiting:
            future.set_exception(error)
        for row in self.rows:
            row.future.set_exception(error)
        self.waiting.clear()
        self.rows, self.logits, self.cache = [], None, SlotKVCache()

    def release_cache(self) -> int:
        """Drop the KV buffers and the cached prefixes (nothing may be running); the bytes released."""
        if self.rows:
            raise RuntimeError(f"{len(self.rows)} rows are running: their KV cannot be released")
        held = self.cache.num_bytes + self.store.num_bytes
        self.cache, self.logits = SlotKVCache(), None
        self.store.clear()
        if self.fused is not None:
            held += self.fused.release()
        return held

    @torch.inference_mode()
    def reprefill_running(self) -> None:
        """After a weight load between steps (partial rollout `continue`): recompute every running
        row's KV and next-token logits under the weights now served, from its prompt and the tokens
        it has so far, so its next token is sampled from the new policy given its whole prefix (the
        tokens before keep the version and log-prob that sampled them). Costs one prefill of
        Σ (P_i + t_i) tokens, counted in `prefilled_tokens`."""
        if not self.rows:
            return
        sequences = [row.request.prompt_ids + tuple(row.tokens) for row in self.rows]
        prefixes = self._prefill_fresh(sequences)  # [n] in row order, each row's own KV columns
        self.cache = SlotKVCache()
        self.cache.reserve_rows(len(self.rows))
        for prefix in prefixes:
            self.cache.admit(prefix.kv, copies=1)
        self.logits = torch.stack([prefix.logits for prefix in prefixes])  # [n, V]
        for row in self.rows:
            row.versions.append((len(row.tokens), self.version))

    # --- 1. admission and prefill --------------------------------------------------------------
    def _admit(self) -> None:
        if self.admission_paused or not self.waiting:
            return
        plan, free, budget = _Admission(), self.max_num_seqs - len(self.rows), self.max_prefill_tokens
        while self.waiting and free > 0:
            request, future = self.waiting[0]
            prompt = request.prompt_ids
            hit = None if prompt in plan.fresh else self.store.lookup(prompt, request.session_id)
            if prompt in plan.fresh or (hit is not None and hit.logits is not None):
                cost = 0  # prefilled once in this step already, or the whole prompt is cached
            else:
                cost = len(prompt) - (len(hit.tokens) if hit is not None else 0)
            if cost > budget and (self.rows or free < self.max_num_seqs):
                break  # over budget, unless nothing would run at all
            self.waiting.popleft()
            budget, free = budget - cost, free - 1
            if prompt in plan.fresh or hit is None:
                plan.fresh.setdefault(prompt, []).append((request, future))
            elif hit.logits is not None:
                plan.cached.append((hit, [(request, future)]))
            else:
                plan.extend.append((hit, request, future))
        joining = sum(map(len, plan.fresh.values())) + sum(len(m) for _, m in plan.cached) + len(plan.extend)
        self.cache.reserve_rows(len(self.rows) + joining)
        for prefix, members in zip(self._prefill_fresh(list(plan.fresh)), plan.fresh.values(), strict=True):
            self.store.put_prompt(prefix)
            self._join(prefix, members[:1], num_cached=0)
            if len(members) > 1:  # the other samples of this prompt reuse the KV just computed
                self._join(prefix, members[1:], num_cached=len(prefix.tokens))
        for prefix, members in plan.cached:
            self._join(prefix, members, num_cached=len(prefix.tokens))
        for past, request, future in plan.extend:
            self._join(
                self._prefill_extension(past, request.prompt_ids), [(request, future)], len(past.tokens)
            )

    def _join(self, prefix: Prefix, members: list[tuple[GenerationRequest, Future]], num_cached: int) -> None:
        """One row per member, each holding a copy of the prefix KV (prefill once, copy n ways)."""
        self.cache.admit(prefix.kv, copies=len(members))
        first_logits = prefix.logits[None].expand(len(members), -1)  # [m, V]
        self.logits = first_logits if self.logits is None else torch.cat([self.logits, first_logits])
        for request, future in members:
            seed = request.sampling.seed
            self.rows.append(
                _Row(
                    request=request,
                    future=future,
                    rule=self.make_rule(request),
                    generator=None if seed is None else torch.Generator().manual_seed(seed),
                    next_position=len(request.prompt_ids),
                    num_cached=num_cached,
                    versions=[(0, self.version)],
                )
            )

    def _prefill_fresh(self, prompts: Sequence[tuple[int, ...]]) -> list[Prefix]:
        """One left-padded forward over distinct prompts; each prompt's own KV columns and last logits."""
        if not prompts:
            return []
        ids, mask = left_pad(prompts, self.pad_token_id)
        ids, mask = ids.to(self.device), mask.to(self.device)
        P = ids.shape[1]
        positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)  # [g, P]
        cache = PrefillCache()
        logits = self._forward(ids, mask, positions, cache, logits_to_keep=1)  # [g, V]
        self.prefilled_tokens += int(mask.sum())
        return [
            Prefix(
                prompt,
                [
                    (k[i : i + 1, :, P - len(prompt) :].clone(), v[i : i + 1, :, P - len(prompt) :].clone())
                    for k, v in cache.layers
                ],
                logits[i],
            )
            for i, prompt in enumerate(prompts)
        ]

    def _prefill_extension(self, past: Prefix, prompt: tuple[int, ...]) -> Prefix:
        """Feed only the tokens of `prompt` after the cached `past` (a session's next turn)."""
        L0, S = len(past.tokens), len(prompt) - len(past.tokens)
        ids = torch.tensor([prompt[L0:]], dtype=torch.int64, device=self.device)
        positions = torch.arange(L0, L0 + S, device=self.device)[None]  # [1, S]
        cache = PrefillCache(past=past.kv)  # every column is attended: no 2D mask
        logits = self._forward(ids, None, positions, cache, logits_to_keep=1)
        self.prefilled_tokens += S
        return Prefix(prompt, cache.layers, logits[0])

    # --- 2-3. sampling, stopping, retirement ---------------------------------------------------
    def _sample_and_retire(self) -> tuple[Tensor, Finished]:
        sampling = RowSampling.from_params([r.request.sampling for r in self.rows], self.device)
        uniforms = draw_uniforms([r.generator for r in self.rows], self.shared_generator, self.device)
        banned = banned_tokens(  # stop ids of rows short of their min_tokens
            [r.rule.banned_ids(len(r.tokens)) for r in self.rows], self.logits.shape[-1], self.device
        )
        tokens, log_probs = next_tokens(self.logits, sampling, uniforms, banned)  # [n], [n]
        done: list[int] = []
        finished: Finished = []
        for i, (row, token, log_prob) in enumerate(
            zip(self.rows, tokens.tolist(), log_probs.tolist(), strict=True)
        ):
            row.tokens.append(token)
            row.log_probs.append(log_prob)
            verdict = row.rule.check(row.tokens)
            if verdict is not None:
                done.append(i)
                finished.append((row.future, self._result(row, *verdict)))
                if row.request.session_id is not None:
                    kv_tokens = row.request.prompt_ids + tuple(row.tokens[:-1])  # the last one was never fed
                    self.store.put_session(
                        row.request.session_id, Prefix(kv_tokens, self.cache.row_kv(i), None)
                    )
        if done:
            order = self.cache.remove(done)
            self.rows = [self.rows[j] for j in order.tolist()]
            tokens = tokens[order.to(tokens.device)]
        return tokens, finished

    def _result(self, row: _Row, reason: FinishReason, stop_reason: int | str | None) -> GenerationResult:
        r, versions = row.request, row.token_versions()
        return GenerationResult(
            request_id=r.request_id,
            prompt_ids=r.prompt_ids,
            response_ids=tuple(row.tokens),
            log_probs=tuple(row.log_probs),
            finish_reason=reason,
            weight_version=min(versions),
            token_versions=versions,
            stop_reason=stop_reason,
            sampling=r.sampling,
            replica_id=self.replica_id,
            num_cached_tokens=row.num_cached,
        )

    # --- 4. decode -----------------------------------------------------------------------------
    def _decode(self, tokens: Tensor) -> None:
        """Feed each running row its last sampled token at its next position; keep the next logits."""
        self.cache.ensure_columns(1)
        attend = self.cache.decode_mask()  # [n, span]
        positions = torch.tensor([[r.next_position] for r in self.rows], device=self.device)  # [n, 1]
        if self.fused is not None:
            self.fused.prepare(self.version)
            self.logits = self.fused.decode(tokens, positions, attend, self.cache)
        else:
            with decode_attention():
                self.logits = self._forward(tokens[:, None], attend, positions, self.cache)
        self.cache.advance()
        for row in self.rows:
            row.next_position += 1

    def _forward(
        self, ids: Tensor, attention_mask: Tensor | None, positions: Tensor, cache, logits_to_keep: int = 1
    ) -> Tensor:
        """Next-token logits [b, V] after the last fed token of each row.

        attention_mask: [b, kv columns] 1 where a row may attend (None: everywhere). The model turns it
        into its causal / sliding-window masks with `transformers.masking_utils`, which ask the cache
        where the queries and keys sit, so every architecture masks as it does in HF `generate`."""
        out = self.model(
            input_ids=ids,
            attention_mask=attention_mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=logits_to_keep,
            **{self.cache_kwarg: cache},
        )
        return out.logits[:, -1]


def left_pad(sequences: Sequence[Sequence[int]], pad_token_id: int) -> tuple[Tensor, Tensor]:
    """(ids [n, P], attention_mask [n, P]) with every sequence aligned to the right edge."""
    P = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), P), pad_token_id, dtype=torch.int64)
    mask = torch.zeros((len(sequences), P), dtype=torch.int64)
    for i, s in enumerate(sequences):
        ids[i, P - len(s) :] = torch.tensor(s, dtype=torch.int64)
        mask[i, P - len(s) :] = 1
    return ids, mask
