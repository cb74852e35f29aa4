"""Layer 5, agent gateway: the smallest HTTP/1.1 server the OpenAI API needs, on asyncio streams.

Requests with a `Content-Length` body (what the `openai` client and `curl` send), keep-alive
connections, JSON responses. A request this layer cannot read (a bad request line, a header block
over 64 KiB, a chunked or oversized body) is answered with an OpenAI-style JSON error and the
connection closed — never dropped without a reply. Everything above HTTP is the handler's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class HttpRequest:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: bytes


@dataclass(frozen=True)
class HttpResponse:
    status: int
    body: dict[str, Any]


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]


class BadHttp(Exception):
    """A request the server cannot read: answered with `status` and the connection closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def error_body(message: str, *, type: str, param: str | None = None, code: str | None = None) -> dict:
    """The OpenAI error object: `{"error": {"message", "type", "param", "code"}}`."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class HttpServer:
    """Serve `handler` on host:port (port 0: the OS picks a free one, read `port` after `start`)."""

    def __init__(self, handler: Handler, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.handler, self.host, self.requested_port = handler, host, port
        self.port: int | None = None
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task, asyncio.StreamWriter] = {}

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.requested_port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for writer in list(self._connections.values()):  # idle keep-alive connections: end them
            writer.close()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = writer
        try:
            while True:
                try:
                    request = await read_request(reader)
                except BadHttp as bad:
                    body = error_body(str(bad), type="invalid_request_error", code="bad_http")
                    await write_response(writer, HttpResponse(bad.status, body), keep_alive=False)
                    return
                if request is None:  # the client closed the connection between requests
                    return
                response = await self.handler(request)
                keep_alive = request.headers.get("connection", "").lower() != "close"
                await write_response(writer, response, keep_alive=keep_alive)
                if not keep_alive:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return  # the client went away mid-request: nobody to answer
        finally:
            self._connections.pop(task, None)
            writer.close()


async def read_request(reader: asyncio.StreamReader) -> HttpRequest | None:
    """One request from the stream; None at a clean end of stream before a request starts."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as err:
        if not err.partial.strip():
            return None
        raise BadHttp(HTTPStatus.BAD_REQUEST, "incomplete HTTP request head") from err
    except asyncio.LimitOverrunError as err:
        raise BadHttp(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "HTTP header block too large") from err
    if len(head) > MAX_HEADER_BYTES:
        raise BadHttp(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "HTTP header block too large")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadHttp(HTTPStatus.BAD_REQUEST, f"not an HTTP/1.x request line: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, sep, value = line.partition(":")
            if not sep:
                raise BadHttp(HTTPStatus.BAD_REQUEST, f"malformed header line {line[:80]!r}")
            headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise BadHttp(
            HTTPStatus.LENGTH_REQUIRED, "chunked request bodies are not accepted: send Content-Length"
        )
    try:
        length = int(headers.get("content-length", "0"))
    except ValueError as err:
        raise BadHttp(HTTPStatus.BAD_REQUEST, "Content-Length is not an integer") from err
    if length < 0 or length > MAX_BODY_BYTES:
        raise BadHttp(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body of {length} bytes (limit {MAX_BODY_BYTES})")
    body = await reader.readexactly(length) if length else b""
    return HttpRequest(parts[0].upper(), parts[1], headers, body)


async def write_response(writer: asyncio.StreamWriter, response: HttpResponse, *, keep_alive: bool) -> None:
    payload = json.dumps(response.body).encode()
    reason = HTTPStatus(response.status).phrase
    head = (
        f"HTTP/1.1 {response.status} {reason}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    )
    writer.write(head.encode("latin-1") + payload)
    await writer.drain()
