"""Layer 5, agent gateway: the OpenAI-compatible endpoint over the rollout engine, with capture.

    GET  /v1/models                          the one model served (any `model` name is accepted)
    POST /e/<episode>/v1/chat/completions    messages (+ tools) -> chat template -> engine -> message
    POST /e/<episode>/v1/completions         text or token ids -> engine -> text
    (/e/<episode>/v1/models answers too: the episode's base_url is a complete OpenAI base URL)

On 127.0.0.1, a free port, and a key made per run (or per gateway): a request without `Authorization: Bearer
<key>` gets 401. Each episode has its own base URL, so its calls are recorded into its
`EpisodeCapture` (the exact ids the engine saw and sampled) whatever the agent's control flow; a
call to a finished or unknown episode gets 404. Errors are the OpenAI error object with a 4xx
(5xx when generation itself failed, counted in `server_errors`), never a dropped connection.
Sampling: the request's temperature / top_p / seed when given, else the run's; max_tokens capped
at the run's `max_response_tokens`; the request's stop strings end the sample where they complete
(`Gateway.cut_at_stop`: any engine, no detokenizer needed); a prompt over `max_prompt_tokens` is
refused (`context_length_exceeded`). With `keep_sampled_ids`, a chat prompt whose text continues an
earlier call of its episode keeps that call's ids (`sampled_prefix.continue_sampled`), counted in
the capture's `prompts_kept_sampled_ids` when they differ from the re-tokenized ones.
`end_episode` closes an episode with how its agent ended; its requests still waiting for the
engine are dropped (`requests_dropped`), and their callers get 404.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import secrets
import time
import zlib
from typing import Any

from stratarl.agent.gateway.agent_program import read_reward
from stratarl.agent.gateway.api_requests import (
    ApiError,
    ChatCall,
    CompletionCall,
    Sampling,
    read_chat,
    read_completion,
    read_json,
)
from stratarl.agent.gateway.batcher import EngineBatcher
from stratarl.agent.gateway.capture import CallRecord, EpisodeCapture
from stratarl.agent.gateway.http_server import HttpRequest, HttpResponse, HttpServer
from stratarl.agent.gateway.sampled_prefix import continue_sampled
from stratarl.agent.gateway.tool_calls import ToolCallFormat
from stratarl.agent.rendering import ChatRenderer, encode, render_text
from stratarl.rollout.interface import GenerationRequest, GenerationResult, RolloutEngine, SamplingParams

MODEL_ID = "stratarl-policy"


class Gateway:
    """`async with Gateway(...) as gateway`: serving; `open_episode(row)` -> (base_url, capture)."""

    def __init__(
        self,
        engine: RolloutEngine,
        renderer: ChatRenderer,
        *,
        sampling: SamplingParams,
        max_prompt_tokens: int,
        tool_format: str = "hermes",
        seed: int | None = None,
        api_key: str | None = None,
        keep_sampled_ids: bool,  # agent.gateway.keep_sampled_ids: the setting holds the one default
    ) -> None:
        self.renderer, self.tokenizer = renderer, renderer.tokenizer
        self.keep_sampled_ids = keep_sampled_ids
        self.sampling, self.max_prompt_tokens, self.seed = sampling, max_prompt_tokens, seed
        self.format = ToolCallFormat(tool_format)
        self.batcher = EngineBatcher(engine)
        self.http = HttpServer(self.handle)
        self.api_key = api_key or new_api_key()
        self.episodes: dict[str, EpisodeCapture] = {}
        self.server_errors = 0
        self.requests_dropped = 0  # engine requests of ended episodes, dropped before they were served
        self._ids = itertools.count()
        self._waiting: dict[str, set[asyncio.Future]] = {}  # episode id -> its requests at the engine

    async def __aenter__(self) -> Gateway:
        await self.http.start()
        self.batcher.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.close()
        await self.batcher.close()

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.http.port}"

    def open_episode(self, row: dict[str, Any], episode_id: str | None = None) -> tuple[str, EpisodeCapture]:
        """A new episode for `row`: its base URL (what the agent gives the OpenAI client) and capture."""
        episode_id = episode_id or f"ep{next(self._ids)}"
        if episode_id in self.episodes or "/" in episode_id:
            raise ValueError(f"episode id {episode_id!r} is taken or contains '/'")
        capture = self.episodes[episode_id] = EpisodeCapture(episode_id, row)
        return f"{self.root_url}/e/{episode_id}/v1", capture

    def end_episode(
        self, capture: EpisodeCapture, status: str, *, value: Any = None, error: str | None = None
    ) -> None:
        """Close the episode: "done" with what the agent returned (`agent_program.read_reward`; a
        value that is no reward makes it "error"), or "timeout" / "error" / "crash" with why. Its
        requests still waiting for the engine are dropped; later calls get 404."""
        if status == "done":
            try:
                capture.reward, capture.reward_extras = read_reward(value)
                capture.status = "done"
            except ValueError as err:
                capture.status, capture.error = "error", str(err)[:300]
        else:
            capture.status, capture.error = status, error
        for future in self._waiting.pop(capture.episode_id, set()):
            if future.cancel():
                self.requests_dropped += 1

    # --- HTTP -----------------------------------------------------------------------------------
    async def handle(self, request: HttpRequest) -> HttpResponse:
        try:
            return HttpResponse(200, await self.route(request))
        except ApiError as err:
            return HttpResponse(err.status, err.body())
        except Exception as err:  # generation failed: the agent hears of it, the run counts it
            self.server_errors += 1
            body = ApiError(
                f"generation failed: {type(err).__name__}: {err}"[:500], status=500, type="server_error"
            ).body()
            return HttpResponse(500, body)

    async def route(self, request: HttpRequest) -> dict[str, Any]:
        if request.headers.get("authorization", "") != f"Bearer {self.api_key}":
            raise ApiError(
                "invalid or missing API key (use the api_key given to the agent)",
                status=401,
                type="invalid_request_error",
                code="invalid_api_key",
            )
        path = request.path.split("?", 1)[0].rstrip("/")
        episode_id, endpoint = _split_path(path)
        if endpoint == "/v1/models":
            _require_method(request, "GET")
            return {"object": "list", "data": [{"id": MODEL_ID, "object": "model", "owned_by": "stratarl"}]}
        if endpoint not in ("/v1/chat/completions", "/v1/completions"):
            raise ApiError(f"no endpoint {path!r}", status=404, code="not_found")
        if episode_id is None:
            raise ApiError(
                "completions are served per episode: use the base_url given to the agent (…/e/<episode>/v1)",
                status=404,
                code="not_found",
            )
        capture = self.episodes.get(episode_id)
        if capture is None or not capture.is_open:
            raise ApiError(
                f"episode {episode_id!r} is unknown or has ended", status=404, code="episode_closed"
            )
        _require_method(request, "POST")
        body = read_json(request.body)
        if endpoint == "/v1/chat/completions":
            return await self.chat(capture, read_chat(body))
        return await self.complete(capture, read_completion(body))

    # --- the two endpoints ----------------------------------------------------------------------
    async def chat(self, capture: EpisodeCapture, call: ChatCall) -> dict[str, Any]:
        try:
            kwargs = {"tools": call.tools} if call.tools else {}
            messages = self.format.template_messages(call.messages)
            text = render_text(self.tokenizer, messages, add_generation_prompt=True, **kwargs)
        except Exception as err:
            raise ApiError(
                f"the chat template cannot render these messages: {err}"[:400], param="messages"
            ) from err
        prompt_ids = encode(self.tokenizer, text)  # the ChatRenderer.prompt_ids of these messages
        kept = continue_sampled(self.tokenizer, text, capture.calls) if self.keep_sampled_ids else None
        if kept is not None and kept != prompt_ids:
            prompt_ids = kept
            capture.prompts_kept_sampled_ids += 1
        results, texts = await self.generate(capture, prompt_ids, call.sampling)
        capture.last_messages = list(call.messages)
        choices, offset = [], capture.num_tool_calls
        for i, (result, text) in enumerate(zip(results, texts, strict=True)):
            message, calls_tools = self.format.response_message(
                text, tools_offered=bool(call.tools), call_offset=offset
            )
            offset += len(message["tool_calls"] or [])
            logprobs = {"content": self.token_logprobs(result)} if call.sampling.logprobs else None
            finish = "tool_calls" if calls_tools else result.finish_reason
            choices.append({"index": i, "message": message, "finish_reason": finish, "logprobs": logprobs})
        capture.num_tool_calls = offset
        return self.envelope("chat.completion", call.model, choices, prompt_ids, results)

    async def complete(self, capture: EpisodeCapture, call: CompletionCall) -> dict[str, Any]:
        prompt_ids = call.prompt if isinstance(call.prompt, list) else encode(self.tokenizer, call.prompt)
        if isinstance(call.prompt, list) and max(call.prompt) >= len(self.tokenizer):
            raise ApiError(
                f"token id {max(call.prompt)} is outside the vocabulary ({len(self.tokenizer)})",
                param="prompt",
            )
        results, texts = await self.generate(capture, prompt_ids, call.sampling)
        prefix = self.tokenizer.decode(prompt_ids) if call.echo else ""
        choices = []
        for i, (result, text) in enumerate(zip(results, texts, strict=True)):
            logprobs = None
            if call.sampling.logprobs:
                tokens = [self.tokenizer.decode([t]) for t in result.response_ids]
                offsets = list(itertools.accumulate([len(t) for t in tokens], initial=len(prefix)))[:-1]
                logprobs = {
                    "tokens": tokens,
                    "token_logprobs": list(result.log_probs),
                    "text_offset": offsets,
                    "top_logprobs": None,
                }
            choices.append(
                {
                    "index": i,
                    "text": prefix + text,
                    "finish_reason": result.finish_reason,
                    "logprobs": logprobs,
                }
            )
        return self.envelope("text_completion", call.model, choices, prompt_ids, results)

    # --- shared ---------------------------------------------------------------------------------
    async def generate(
        self, capture: EpisodeCapture, prompt_ids: list[int], asked: Sampling
    ) -> tuple[list[GenerationResult], list[str]]:
        """n samples of `prompt_ids` from the shared engine batch, recorded into the episode."""
        if len(prompt_ids) > self.max_prompt_tokens:
            raise ApiError(
                f"the prompt has {len(prompt_ids)} tokens; this endpoint takes at most "
                f"{self.max_prompt_tokens} (agent.gateway.max_prompt_tokens)",
                param="messages",
                code="context_length_exceeded",
            )
        k = len(capture.calls)
        try:
            params = [self.params(asked, capture, k + i) for i in range(asked.n)]
        except ValueError as err:
            raise ApiError(str(err)) from err
        requests = [
            GenerationRequest(f"{capture.episode_id}/{k + i}", prompt_ids, p) for i, p in enumerate(params)
        ]
        results = [self.cut_at_stop(r, asked.stop) for r in await self.served(capture, requests)]
        texts = [_text_before_stop(self.renderer.assistant_text(r.response_ids), asked.stop) for r in results]
        if capture.is_open:  # an episode cancelled meanwhile keeps no late call
            capture.calls.extend(CallRecord.from_result(r, t) for r, t in zip(results, texts, strict=True))
        return results, texts

    async def served(
        self, capture: EpisodeCapture, requests: list[GenerationRequest]
    ) -> list[GenerationResult]:
        """The engine's results of an episode's requests; 404 when the episode ends before they come."""
        future = self.batcher.submit(requests)
        waiting = self._waiting.setdefault(capture.episode_id, set())
        waiting.add(future)
        try:
            return await future
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if future.cancelled() and not capture.is_open and not (task and task.cancelling()):
                raise ApiError(
                    f"episode {capture.episode_id!r} has ended", status=404, code="episode_closed"
                ) from None
            raise
        finally:
            waiting.discard(future)

    def params(self, asked: Sampling, capture: EpisodeCapture, call_index: int) -> SamplingParams:
        seed = asked.seed
        if seed is None and self.seed is not None:  # reproducible per (episode, call), not arrival order
            seed = (self.seed + zlib.crc32(f"{capture.episode_id}/{call_index}".encode())) % 2**31
        cap = self.sampling.max_tokens
        return dataclasses.replace(
            self.sampling,
            temperature=self.sampling.temperature if asked.temperature is None else asked.temperature,
            top_p=self.sampling.top_p if asked.top_p is None else asked.top_p,
            max_tokens=cap if asked.max_tokens is None else min(asked.max_tokens, cap),
            min_tokens=0,
            seed=seed,
        )

    def cut_at_stop(self, result: GenerationResult, stops: tuple[str, ...]) -> GenerationResult:
        """The sample up to and including the token that completes the first of the request's stop
        strings (finish "stop"); unchanged when none occurs. Stopping a sample at the first time a
        condition holds on its prefix is still a sample of the policy: the ids and log-probs kept
        are exactly those drawn. (Any engine serves this; the tokens after the cut are discarded.)"""
        if not stops or not any(s in self.tokenizer.decode(result.response_ids) for s in stops):
            return result
        ids = result.response_ids
        end = next(
            k for k in range(1, len(ids) + 1) if any(s in self.tokenizer.decode(ids[:k]) for s in stops)
        )
        return dataclasses.replace(
            result,
            response_ids=ids[:end],
            log_probs=result.log_probs[:end],
            token_versions=result.token_versions[:end],
            weight_version=min(result.token_versions[:end]),
            finish_reason="stop",
            stop_reason=next(s for s in stops if s in self.tokenizer.decode(ids[:end])),
        )

    def token_logprobs(self, result: GenerationResult) -> list[dict[str, Any]]:
        out = []
        for token_id, log_prob in zip(result.response_ids, result.log_probs, strict=True):
            token = self.tokenizer.decode([token_id])
            out.append(
                {"token": token, "logprob": log_prob, "bytes": list(token.encode()), "top_logprobs": []}
            )
        return out

    def envelope(self, kind: str, model: str, choices: list, prompt_ids: list[int], results: list) -> dict:
        completion = sum(len(r.response_ids) for r in results)
        return {
            "id": f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{secrets.token_hex(8)}",
            "object": kind,
            "created": int(time.time()),
            "model": model or MODEL_ID,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": completion,
                "total_tokens": len(prompt_ids) + completion,
            },
        }


def new_api_key() -> str:
    return "sk-stratarl-" + secrets.token_hex(16)


def _split_path(path: str) -> tuple[str | None, str]:
    """("/e/ep3/v1/completions") -> ("ep3", "/v1/completions"); no episode prefix -> (None, path)."""
    if path.startswith("/e/"):
        episode_id, _, rest = path[3:].partition("/")
        return episode_id, "/" + rest
    return None, path


def _require_method(request: HttpRequest, method: str) -> None:
    if request.method != method:
        raise ApiError(
            f"{request.method} is not allowed here; use {method}", status=405, code="method_not_allowed"
        )


def _text_before_stop(text: str, stops: tuple[str, ...]) -> str:
    """The text up to the first stop string, as OpenAI returns it (the sampled ids keep it whole)."""
    cuts = [text.find(s) for s in stops if s in text]
    return text[: min(cuts)] if cuts else text
