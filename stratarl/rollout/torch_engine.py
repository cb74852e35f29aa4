"""Layer 5, rollout: the native generation backend — continuous batching on an in-process HF causal LM.

The decode loop is ours (the model's forward with our KV cache, not `model.generate`), so that
log-probs follow the rule of `stratarl.rollout.sampling` and requests can join and leave the
running batch at every step (`stratarl.rollout.engine_core`). The batch call `generate(requests)`
and the async call `await generate_async(request)` come from `stratarl.rollout.engine_loop`; this
module adds construction (dtype, stop rules) and weight updates. What a load does to the requests
running when it arrives is `partial_rollout`:

    finish    the load waits until they finish on the old weights (every result has one version);
    continue  the load happens at the next step boundary; the running rows pause while the weights
              arrive, then their KV and next-token logits are recomputed under the new weights from
              prompt + tokens so far (`EngineCore.reprefill_running`) and they go on. Each token
              records the version that sampled it (`GenerationResult.token_versions`), and its
              log-prob is that version's, given its whole prefix.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping, Sequence
from concurrent.futures import Future

import torch
from torch import Tensor, nn

from stratarl.engine.lora import AdapterUpdate, apply_adapter_update
from stratarl.rollout.engine_core import EngineCore
from stratarl.rollout.engine_loop import Finished, SteppedEngine
from stratarl.rollout.fused_decode import DECODE_STEPS, FusedDecoder, covers
from stratarl.rollout.interface import GenerationRequest
from stratarl.rollout.stopping import Detokenize, StopRule
from stratarl.rollout.weight_sync import (
    DEFAULT_BUCKET_BYTES,
    PushedReplica,
    TensorSlice,
    WeightLoadReport,
    WeightReceiver,
    WeightSyncError,
    check_state_dict_keys,
    tensor_bytes,
)

SERVED_LAYER_TYPES = ("full_attention", "sliding_attention")
PARTIAL_ROLLOUT = ("finish", "continue")  # what a weight load does to running requests (module doc)


def check_architecture(config) -> None:
    """Refuse, naming the config field, a model whose layers the slot KV cache cannot serve.

    Full and sliding-window attention both attend over KV columns, masked by the model's own
    `masking_utils` (a window is a distance in columns, which is one in positions within a row).
    Chunked attention (Llama 4) cuts at multiples of the absolute position, which the shared column
    timeline does not encode per row; linear-attention and recurrent layers keep a state, not KV."""
    layer_types = getattr(config, "layer_types", None) or []
    others = sorted(set(layer_types) - set(SERVED_LAYER_TYPES))
    if others:
        raise NotImplementedError(
            f"{config.model_type}: config.layer_types holds {others}; the torch rollout engine serves "
            f"{' and '.join(SERVED_LAYER_TYPES)} layers only (chunked attention masks by absolute-position "
            "chunks, linear/recurrent layers keep a state instead of KV columns)"
        )
    if getattr(config, "use_bidirectional_attention", False):
        raise NotImplementedError(
            f"{config.model_type}: config.use_bidirectional_attention is set; generation needs causal "
            "attention"
        )


def _decode_step(model: nn.Module, decode_step: str, owns_weights: bool) -> tuple[FusedDecoder | None, str]:
    """(our decode step or None, what runs: "fused", or "hf" and why) for `decode_step`."""
    if decode_step == "hf":
        return None, "hf (rollout.decode_step=hf)"
    reason = covers(model)
    if reason is None:
        return FusedDecoder(model, views=owns_weights), "fused"
    if decode_step == "fused":
        raise ValueError(f"rollout.decode_step=fused: {reason}")
    return None, f"hf ({reason})"


class TorchRolloutEngine(SteppedEngine, PushedReplica):
    """A `RolloutEngine` over an in-process HF causal LM (any `AutoModelForCausalLM` whose layers are
    full or sliding-window attention: `check_architecture`).

    eos_token_ids: ids that end every request (the tokenizer's EOS, e.g. `<|im_end|>`).
    pad_token_id: fills left padding inside prefills (never visible in results).
    seed: seeds the shared generator used by requests without their own seed.
    max_num_seqs: the most sequences decoded together (rows of the running batch).
    max_prefill_tokens: prompt tokens prefilled per step at most (the budget under which new
        requests join; a single longer prompt is still admitted when nothing else runs).
    prefix_cache_tokens: tokens of prompt/session KV kept for reuse (`PrefixStore`; 0 = off).
    dtype: serve the model in this dtype (e.g. torch.bfloat16): the model is cast in place.
    detokenize: token ids -> text (e.g. `tokenizer.decode`), needed for stop strings.
    replica_id: recorded in every result (set by whoever builds several replicas).
    partial_rollout: finish or continue, what a weight load does to running requests (module doc).
    decode_step: what computes a decode step (`stratarl.rollout.fused_decode`): fused (our step; a model
        it does not cover is refused), hf (the model's own forward), auto (fused where covered, else
        hf). `decode_step_used` says which runs, and why when it is not fused.
    owns_weights: False when `model` is the trainer's own (`rollout.weight_sharing`): the fused path
        then keeps copies of the weights per version instead of re-laying out the model's tensors.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        eos_token_ids: int | Sequence[int],
        pad_token_id: int,
        seed: int | None = None,
        max_num_seqs: int = 256,
        max_prefill_tokens: int = 4096,
        prefix_cache_tokens: int = 16384,
        dtype: torch.dtype | None = None,
        detokenize: Detokenize | None = None,
        replica_id: int = 0,
        partial_rollout: str = "finish",
        decode_step: str = "auto",
        owns_weights: bool = True,
    ) -> None:
        check_architecture(model.config)
        if decode_step not in DECODE_STEPS:
            raise ValueError(f"decode_step={decode_step!r}; valid: {', '.join(DECODE_STEPS)}")
        if partial_rollout not in PARTIAL_ROLLOUT:
            raise ValueError(f"partial_rollout={partial_rollout!r}; valid: {', '.join(PARTIAL_ROLLOUT)}")
        self.partial_rollout = partial_rollout
        if dtype is not None:
            model.to(dtype)
        self.model = model
        self.eos_token_ids = (eos_token_ids,) if isinstance(eos_token_ids, int) else tuple(eos_token_ids)
        self.detokenize = detokenize
        self.replica_id = replica_id
        self.max_context = getattr(model.config, "max_position_embeddings", None)
        shared = torch.Generator()
        if seed is None:
            shared.seed()
        else:
            shared.manual_seed(seed)
        # transformers 5.24 names the KV-cache argument `cache` (`past_key_values` is deprecated there);
        # older releases only know `past_key_values`.
        forward_args = inspect.signature(model.forward).parameters
        fused, self.decode_step_used = _decode_step(model, decode_step, owns_weights)
        self._core = EngineCore(
            model,
            make_rule=self._stop_rule,
            pad_token_id=pad_token_id,
            shared_generator=shared,
            max_num_seqs=max_num_seqs,
            max_prefill_tokens=max_prefill_tokens,
            prefix_cache_tokens=prefix_cache_tokens,
            replica_id=replica_id,
            cache_kwarg="cache" if "cache" in forward_args else "past_key_values",
            fused=fused,
        )
        super().__init__()
        self._receiver: WeightReceiver | None = None
        self._load_waiting = False  # a partial_rollout=continue load waits for the step boundary
        self._broken: str | None = None  # why the served weights are not a whole version
        self._adapter_base: dict[str, Tensor] | None = None  # W₀ of the LoRA-adapted modules
        self._restore_training = False  # the served module was in training mode before this work

    # --- state -----------------------------------------------------------------------------------
    @property
    def weight_version(self) -> int:
        return self._core.version

    @property
    def device(self) -> torch.device:
        return self._core.device

    @property
    def load(self) -> int:
        """Requests queued or running: what a least-loaded router compares."""
        return len(self._core.waiting) + len(self._core.rows)

    @property
    def prefilled_tokens(self) -> int:
        """Prompt tokens run through the model so far (prefix sharing keeps this below the total)."""
        return self._core.prefilled_tokens

    def release_memory(self) -> int:
        """The colocated hand-off: free the KV cache (the decode batch's buffers and the cached
        prefixes) while the same device trains; the next generation allocates it again. Returns the
        bytes released; 0 while requests are queued or running (an async trainer's generation
        overlapping an update keeps its cache)."""
        with self._step_lock:
            if self._core.rows or self._core.waiting:
                return 0
            return self._core.release_cache()

    # --- the SteppedEngine hooks (generate / generate_async / submit come from there) -------------
    def _validate(self, requests: Sequence[GenerationRequest]) -> None:
        if self._broken is not None:
            raise WeightSyncError(self._broken)
        for request in requests:
            self._stop_rule(request)
            if self.max_context is not None and len(request.prompt_ids) >= self.max_context:
                raise ValueError(
                    f"request {request.request_id!r}: prompt of {len(request.prompt_ids)} tokens does not "
                    f"fit the model's context of {self.max_context}"
                )

    def _enqueue(self, pairs: list[tuple[GenerationRequest, Future]]) -> None:
        self._core.waiting.extend(pairs)  # deque.extend is atomic: no lock against a running step

    def _can_step(self) -> bool:
        # no step while weights arrive, nor while a load waits for the step lock (a loop re-taking
        # the lock at once would starve it: threading.Lock is not fair)
        return self._receiver is None and not self._load_waiting and self._core.can_step()

    def _step(self) -> Finished:
        return self._in_eval(self._core.step)

    def _in_eval(self, fn):
        """Run `fn` (a step) in eval mode. A module in training mode — the actor's, served under
        `rollout.weight_sharing` — is switched once for a run of steps and back to training when the
        engine has no work left (or a step raises), not twice per step: `eval()` walks every module,
        1.5 ms a switch and back on SmolLM2-135M's 397."""
        if self.model.training:
            self.model.eval()
            self._restore_training = True
        try:
            result = fn()
        except BaseException:
            self._leave_eval()
            raise
        if not (self._core.rows or self._core.waiting):
            self._leave_eval()
        return result

    def _leave_eval(self) -> None:
        if self._restore_training:
            self.model.train()
            self._restore_training = False

    def _fail_all(self, error: BaseException) -> None:
        self._core.fail_all(error)

    def _blocked_reason(self) -> str | None:
        if self._receiver is not None and self.partial_rollout == "finish":
            return "engine is receiving weights: call finish_weight_update first"
        return None

    def _stop_rule(self, request: GenerationRequest) -> StopRule:
        budget = None if self.max_context is None else self.max_context - len(request.prompt_ids)
        return StopRule(request.sampling, self.eos_token_ids, self.detokenize, context_budget=budget)

    # --- weights ---------------------------------------------------------------------------------
    def load_adapter(
        self,
        update: AdapterUpdate,
        version: int,
        *,
        base: Mapping[str, Tensor] | None = None,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    ) -> WeightLoadReport:
        """Serve a LoRA policy as `version`, W' = W₀ + s·B·A for each module `update` adapts, when only
        A, B and s travel (`engine.lora`; verl's adapter-only sync after `base_sync_done`).

        The first call brings `base`, the full base state dict (HF names): it is loaded whole with the
        adapter merged, and the engine keeps W₀ of the adapted modules (the tensors given, not copies)
        for later calls, which bring the adapter alone and reload only those modules. The report's
        num_bytes counts what travelled: base and adapter, then the adapter."""
        if base is not None:
            self._adapter_base = {f"{m}.weight": base[f"{m}.weight"] for m in update.lora_a}
            report = self.load_weights(
                apply_adapter_update(dict(base), update), version, bucket_bytes=bucket_bytes
            )
            return dataclasses.replace(report, num_bytes=tensor_bytes(base) + update.num_bytes)
        held = {key.removesuffix(".weight") for key in self._adapter_base or {}}
        if self._adapter_base is None or set(update.lora_a) != held:
            raise WeightSyncError(
                f"the adapter covers modules {sorted(update.lora_a)[:10]}, the base weights held cover "
                f"{sorted(held)[:10]}: the first load_adapter brings the base (base=...), later ones the "
                "same modules"
            )
        merged = apply_adapter_update(self._adapter_base, update)
        report = self.load_weights(merged, version, bucket_bytes=bucket_bytes, partial=True)
        return dataclasses.replace(report, num_bytes=update.num_bytes)

    def serve_shared_weights(self, model: nn.Module, version: int) -> WeightLoadReport:
        """The engine serves `model` itself (`rollout.weight_sharing`), whose parameters an optimizer
        has just stepped in place: serve them as `version`. Nothing travels; what is checked is that
        the module is still the one served and that no request saw the weights change (a generation
        overlapping an update would mix two policies in one response). Cached prefixes are dropped:
        their KV is the old weights'."""
        if model is not self.model:
            raise WeightSyncError(
                f"serve_shared_weights got a {type(model).__name__} that is not the module this engine "
                "serves: it was built with its own copy (share_weights=False), so load_weights is the sync"
            )
        with self._step_lock:
            if self._core.rows or self._core.waiting:
                raise WeightSyncError(
                    f"{len(self._core.rows)} running and {len(self._core.waiting)} queued requests saw the "
                    "shared weights change under them: with rollout.weight_sharing=share no generation may "
                    "overlap an update"
                )
            if version <= self._core.version:
                raise WeightSyncError(
                    f"weight version must increase: serving {self._core.version}, asked to serve {version}"
                )
            self._core.version, self._broken = version, None
            self._core.store.clear()
        tensors = len(self.model.state_dict())
        return WeightLoadReport(version, num_tensors=tensors, num_changed=0, checksum=0, shared=True)

    def check_weights(self, state_dict: Mapping[str, Tensor]) -> None:
        """Strict keys and shapes against the served model (`WeightSyncError` naming the misfits)."""
        check_state_dict_keys(self.model, state_dict)

    def begin_weight_update(self, version: int, *, partial: bool = False) -> None:
        """Stop admitting, then accept buckets: once running requests finish on the old version
        (partial_rollout=finish), or at once, between two steps, the running rows paused until
        `finish_weight_update` (continue)."""
        if version <= self._core.version:
            raise WeightSyncError(
                f"weight version must increase: serving {self._core.version}, asked to load {version}"
            )
        if self.partial_rollout == "finish":
            self._core.admission_paused = True
            self._step_until(lambda: not self._core.rows)
            self._receiver = WeightReceiver(self.model, version, partial=partial)
            return
        self._load_waiting = True
        try:
            with self._step_lock:  # a step boundary: no step runs again before finish_weight_update
                self._core.admission_paused = True
                self._receiver = WeightReceiver(self.model, version, partial=partial)
        finally:
            self._load_waiting = False

    def receive_weights(self, bucket: Sequence[TensorSlice]) -> None:
        if self._receiver is None:
            raise WeightSyncError("receive_weights before begin_weight_update")
        with self._step_lock:
            self._guard(self._receiver.receive, bucket)

    def finish_weight_update(self) -> WeightLoadReport:
        """Verify the received weights, serve them as the new version, resume admitting requests."""
        if self._receiver is None:
            raise WeightSyncError("finish_weight_update before begin_weight_update")
        with self._step_lock:
            report = self._guard(self._receiver.finish)
            self._core.version, self._receiver, self._broken = report.version, None, None
            self._core.store.clear()  # cached prefixes were computed with the old weights
            self._core.admission_paused = False
            if self._core.rows:  # partial_rollout=continue: their KV is the old weights'
                try:
                    self._in_eval(self._core.reprefill_running)
                except BaseException as error:
                    self._core.fail_all(error)
                    raise
        if self._core.can_step():
            self._start_driver()
        return report

    def _guard(self, fn, *args):
        try:
            return fn(*args)
        except Exception as error:
            version = self._receiver.version if self._receiver else "?"
            self._broken = f"a sync to version {version} failed, the served weights are mixed: {error}"
            self._receiver, self._core.admission_paused = None, False
            self._core.fail_all(WeightSyncError(self._broken))  # queued requests must not run on them
            raise
