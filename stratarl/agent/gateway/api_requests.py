"""Layer 5, agent gateway: an OpenAI request body checked and read into what the engine needs.

`read_chat` and `read_completion` turn the JSON of `POST /v1/chat/completions` and `POST
/v1/completions` into a `ChatCall` / `CompletionCall`, or raise `ApiError` (a 4xx with the OpenAI
error object, `param` naming the field). What is read: messages (text content, assistant
`tool_calls`, tool results), `tools` / `tool_choice`, `temperature`, `top_p`, `max_tokens` (or
`max_completion_tokens`), `stop`, `n`, `seed`, `logprobs`. Fields the engine cannot honour are
refused, not ignored: `stream=true`, `top_logprobs` > 0, non-zero presence/frequency penalties,
`logit_bias`, a `response_format` other than text, a `tool_choice` that forces a call (there is no
constrained decoding). Other fields (`model`, `user`, `metadata`, ...) do not change generation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from stratarl.agent.gateway.http_server import error_body

ROLES = ("system", "user", "assistant", "tool")
MAX_N = 16
MAX_STOP = 4


class ApiError(Exception):
    """A request the API refuses: HTTP `status` and the OpenAI error object."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        type: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.param, self.type, self.code = status, param, type, code

    def body(self) -> dict[str, Any]:
        return error_body(str(self), type=self.type, param=self.param, code=self.code)


@dataclass(frozen=True)
class Sampling:
    """What the request asks of sampling; None: the run's setting."""

    temperature: float | None
    top_p: float | None
    max_tokens: int | None
    stop: tuple[str, ...]
    n: int
    seed: int | None
    logprobs: bool


@dataclass(frozen=True)
class ChatCall:
    model: str
    messages: list[dict[str, Any]]  # roles and text content; assistant tool_calls as OpenAI objects
    tools: list[dict[str, Any]]  # OpenAI function tools; [] with tool_choice "none"
    sampling: Sampling


@dataclass(frozen=True)
class CompletionCall:
    model: str
    prompt: str | list[int]  # text, or token ids used as they are
    sampling: Sampling
    echo: bool


def read_json(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as err:
        raise ApiError(f"the request body is not JSON: {str(err)[:80]}") from err
    if not isinstance(value, dict):
        raise ApiError(f"the request body must be a JSON object, got {type(value).__name__}")
    return value


def read_chat(body: dict[str, Any]) -> ChatCall:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError("'messages' must be a non-empty list", param="messages")
    checked = [_message(m, i) for i, m in enumerate(messages)]
    tools = _tools(body.get("tools"))
    choice = body.get("tool_choice", "auto" if tools else "none")
    if choice == "none":
        tools = []
    elif choice != "auto":
        raise ApiError(
            f"tool_choice {choice!r} is not supported: this endpoint has no constrained decoding to "
            "force a call; use 'auto' or 'none'",
            param="tool_choice",
        )
    if body.get("top_logprobs"):
        raise ApiError(
            "top_logprobs is not supported: only the sampled token's log-prob is reported",
            param="top_logprobs",
        )
    logprobs = body.get("logprobs", False)
    if not isinstance(logprobs, bool) and logprobs is not None:
        raise ApiError("'logprobs' must be a boolean", param="logprobs")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    return ChatCall(_model(body), checked, tools, _sampling(body, max_tokens, bool(logprobs)))


def read_completion(body: dict[str, Any]) -> CompletionCall:
    prompt = body.get("prompt")
    is_ids = isinstance(prompt, list) and prompt and all(type(t) is int and t >= 0 for t in prompt)
    if not (isinstance(prompt, str) and prompt) and not is_ids:
        raise ApiError("'prompt' must be a non-empty string or a list of token ids", param="prompt")
    logprobs = body.get("logprobs")
    if logprobs is not None and (type(logprobs) is not int or not 0 <= logprobs <= 1):
        raise ApiError(
            "'logprobs' must be 0 or 1 here: only the sampled token's log-prob is reported", param="logprobs"
        )
    if body.get("suffix") or (body.get("best_of") or 1) != 1:
        raise ApiError(
            "suffix and best_of are not supported", param="suffix" if body.get("suffix") else "best_of"
        )
    sampling = _sampling(body, body.get("max_tokens", 16), logprobs is not None)
    return CompletionCall(_model(body), prompt, sampling, bool(body.get("echo", False)))


def _model(body: dict[str, Any]) -> str:
    model = body.get("model", "")
    if not isinstance(model, str):
        raise ApiError("'model' must be a string", param="model")
    return model


def _sampling(body: dict[str, Any], max_tokens: Any, logprobs: bool) -> Sampling:
    if body.get("stream"):
        raise ApiError(
            "stream=true is not supported: this endpoint answers with whole completions", param="stream"
        )
    for key in ("presence_penalty", "frequency_penalty"):
        if body.get(key):
            raise ApiError(f"{key} is not supported (only 0)", param=key)
    if body.get("logit_bias"):
        raise ApiError("logit_bias is not supported", param="logit_bias")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise ApiError(
            "response_format is not supported (no constrained decoding); only type 'text'",
            param="response_format",
        )
    temperature = _number(body, "temperature", 0.0, 2.0)
    top_p = _number(body, "top_p", 0.0, 1.0)
    if top_p == 0.0:
        raise ApiError("'top_p' must be in (0, 1]", param="top_p")
    n = body.get("n", 1)
    if type(n) is not int or not 1 <= n <= MAX_N:
        raise ApiError(f"'n' must be an integer in [1, {MAX_N}]", param="n")
    if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
        raise ApiError("'max_tokens' must be an integer >= 1", param="max_tokens")
    seed = body.get("seed")
    if seed is not None and type(seed) is not int:
        raise ApiError("'seed' must be an integer", param="seed")
    return Sampling(temperature, top_p, max_tokens, _stop(body.get("stop")), n, seed, logprobs)


def _number(body: dict[str, Any], key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ApiError(f"'{key}' must be a number in [{low:g}, {high:g}], got {value!r}", param=key)
    return float(value)


def _stop(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if (
        not isinstance(stops, list)
        or len(stops) > MAX_STOP
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise ApiError(
            f"'stop' must be a non-empty string or a list of at most {MAX_STOP} of them", param="stop"
        )
    return tuple(stops)


def _message(message: Any, i: int) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise ApiError(f"{where} must be an object", param=where)
    role = message.get("role")
    if role == "developer":  # the newer name of the system role
        role = "system"
    if role not in ROLES:
        raise ApiError(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}", param=f"{where}.role")
    out: dict[str, Any] = {"role": role, "content": _content(message.get("content"), f"{where}.content")}
    calls = message.get("tool_calls")
    if calls:
        if role != "assistant" or not isinstance(calls, list):
            raise ApiError(
                f"{where}.tool_calls must be a list on an assistant message", param=f"{where}.tool_calls"
            )
        out["tool_calls"] = [_history_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]
    if role == "tool" and message.get("tool_call_id") is not None:
        out["tool_call_id"] = str(message["tool_call_id"])
    if isinstance(message.get("name"), str):
        out["name"] = message["name"]
    return out


def _content(content: Any, where: str) -> str:
    """Text content: a string, null, or a list of `{"type": "text", "text": ...}` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(texts) == len(content) and all(isinstance(t, str) for t in texts):
            return "".join(texts)
    raise ApiError(
        f"{where} must be a string or a list of text parts (this model reads text only)", param=where
    )


def _history_call(call: Any, where: str) -> dict[str, Any]:
    """An earlier assistant tool call, its arguments decoded (chat templates read them as objects)."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ApiError(
            f"{where} must be {{'type': 'function', 'function': {{'name', 'arguments'}}}}", param=where
        )
    arguments = function.get("arguments", "{}")
    try:
        decoded = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError as err:
        raise ApiError(
            f"{where}.function.arguments is not JSON", param=f"{where}.function.arguments"
        ) from err
    if not isinstance(decoded, dict):
        raise ApiError(
            f"{where}.function.arguments must be a JSON object", param=f"{where}.function.arguments"
        )
    return {"id": str(call.get("id", "")), "type": "function", "name": function["name"], "arguments": decoded}


def _tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise ApiError("'tools' must be a list", param="tools")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type") != "function" or not function.get("name"):
            raise ApiError(
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name', ...}}}}", param=f"tools[{i}]"
            )
    return [dict(t) for t in tools]
