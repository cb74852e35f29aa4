"""Layer 5, rewards: the wire format between a `CallPool` and its workers — length-prefixed frames.

A frame is an 8-byte big-endian length, then that many bytes (a pickle). The worker reads and
writes with plain blocking calls (`send_frame`, `recv_frame`). The pool never blocks on a read:
`FrameReader.feed` takes whatever bytes one `recv` returned and hands back the frames that are
complete, so a worker that wrote half a message (user code writing to the socket, a crash mid-send)
leaves a partial frame behind and the call's own deadline still fires. A header announcing more
than `MAX_FRAME_BYTES` is refused at once. Stdlib only: the worker imports this.
"""

from __future__ import annotations

import socket
import struct

HEADER = struct.Struct("!Q")
MAX_FRAME_BYTES = 256 * 2**20  # a result larger than this is a broken worker, not a result


class FrameError(Exception):
    """The peer sent bytes that are not a frame (a length over `MAX_FRAME_BYTES`)."""


def send_frame(sock: socket.socket, data: bytes) -> None:
    sock.sendall(HEADER.pack(len(data)) + data)


def recv_frame(sock: socket.socket) -> bytes:
    """One whole frame (blocking); EOFError when the peer closed the socket."""
    (size,) = HEADER.unpack(_recv_exactly(sock, HEADER.size))
    if size > MAX_FRAME_BYTES:
        raise FrameError(f"a frame of {size} bytes is over the {MAX_FRAME_BYTES}-byte limit")
    return _recv_exactly(sock, size)


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 2**20))
        if not chunk:
            raise EOFError("the socket was closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class FrameReader:
    """Bytes in, whole frames out; never waits."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        frames = []
        while len(self._buffer) >= HEADER.size:
            (size,) = HEADER.unpack_from(self._buffer)
            if size > MAX_FRAME_BYTES:
                raise FrameError(f"a frame header announced {size} bytes (limit {MAX_FRAME_BYTES})")
            end = HEADER.size + size
            if len(self._buffer) < end:
                break
            frames.append(bytes(self._buffer[HEADER.size : end]))
            del self._buffer[:end]
        return frames

    @property
    def partial_bytes(self) -> int:
        """Bytes of an unfinished frame received so far (0: nothing half-sent)."""
        return len(self._buffer)
