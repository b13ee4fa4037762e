"""Courier's message framing on top of the codec: paths, frame kinds, chunked transfer.

Every call is one gRPC unary round trip (streaming RPCs cost about twice as much per call in
grpcio). A message too large to travel whole -- parameters of hundreds of MB -- is moved
through a side stream in chunks instead, and the unary call carries only a reference to it:
both ends then hold about one copy of the payload instead of the four that a unary message
makes (serialised bytes, gRPC's slice, the received slice, the Python bytes).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Iterable, Iterator, Sequence

SERVICE = "jaxdist.Courier"
LIST_METHODS = "_methods"
UPLOAD = "_upload"
DOWNLOAD = "_download"
SHARED_MEMORY_PROBE = "_shared_memory"
HELLO = "_hello"  # answered without the token: the server proves it holds it (see `server_proof`)

TOKEN_KEY = "jaxdist-token"  # the token, or a session key derived from it (see `session_key`)
HELLO_KEY = "jaxdist-hello"  # a hello's nonce: hex, 32 to 64 digits
SIZE_KEY = "jaxdist-size"
SHARED_MEMORY_KEY = "jaxdist-shared-memory"  # the server's ticket, from a caller that may be answered in shared memory
BUSY_KEY = "jaxdist-busy"  # trailing metadata of a RESOURCE_EXHAUSTED that a later retry may pass
GRPC_CONCURRENCY_LIMIT = "Concurrent RPC limit exceeded!"  # gRPC's own details for maximum_concurrent_rpcs

# The first byte of every courier frame says what follows.
INLINE = b"\x00"  # a codec frame
STAGED = b"\x01"  # a reference to a payload moved by _upload/_download: id + size
ERROR = b"\x02"  # a codec frame describing a remote exception
SHARED = b"\x03"  # a reference to a payload in a shared-memory segment: generation + size + name

CHUNK_BYTES = 1 << 20
DEFAULT_INLINE_LIMIT = 8 << 20
DEFAULT_MAX_MESSAGE_BYTES = 4 << 30
SHARED_MEMORY_THRESHOLD = 128 << 10  # larger messages between processes of one host skip the socket
DEFAULT_SHARED_MEMORY_BYTES = 1 << 30  # per client and per server: segments kept for reuse

_STAGED_FORMAT = struct.Struct("<16sQ")
_SHARED_FORMAT = struct.Struct("<QQ")
_MAX_SHARED_NAME = 64


def path(method: str) -> str:
    return f"/{SERVICE}/{method}"


def method_name(grpc_path: str) -> str | None:
    """The method a gRPC path names, or None when the path is not courier's."""
    prefix = f"/{SERVICE}/"
    return grpc_path[len(prefix):] if grpc_path.startswith(prefix) else None


def grpc_options(max_send_bytes: int, max_receive_bytes: int) -> list[tuple[str, int]]:
    """Options both ends share: raised message limits and no port sharing."""
    return [
        ("grpc.max_send_message_length", min(max_send_bytes, 2**31 - 1)),
        ("grpc.max_receive_message_length", min(max_receive_bytes, 2**31 - 1)),
        ("grpc.so_reuseport", 0),
    ]


def staged_frame(blob_id: bytes, size: int) -> bytes:
    return STAGED + _STAGED_FORMAT.pack(blob_id, size)


def parse_staged(frame: memoryview) -> tuple[bytes, int]:
    """(blob id, size) of a STAGED frame; ValueError when it is not one."""
    if len(frame) != 1 + _STAGED_FORMAT.size:
        raise ValueError(f"a staged reference is {1 + _STAGED_FORMAT.size} bytes, got {len(frame)}")
    blob_id, size = _STAGED_FORMAT.unpack(frame[1:])
    return blob_id, size


def shared_frame(name: str, generation: int, size: int) -> bytes:
    return SHARED + _SHARED_FORMAT.pack(generation, size) + name.encode("ascii")


def parse_shared(frame: memoryview) -> tuple[str, int, int]:
    """(segment name, generation, size) of a SHARED frame; ValueError when it is not one."""
    if not 1 + _SHARED_FORMAT.size < len(frame) <= 1 + _SHARED_FORMAT.size + _MAX_SHARED_NAME:
        raise ValueError(f"a shared-memory reference is at most {1 + _SHARED_FORMAT.size + _MAX_SHARED_NAME} "
                         f"bytes, got {len(frame)}")
    generation, size = _SHARED_FORMAT.unpack(frame[1:1 + _SHARED_FORMAT.size])
    return bytes(frame[1 + _SHARED_FORMAT.size:]).decode("ascii", "replace"), generation, size


def server_proof(token: bytes, nonce: str, instance: str) -> str:
    """What a server answers a hello with `nonce`: proof that it holds `token`, bound to the
    server's `instance` (a random name of the running server, new at each start)."""
    return hmac.new(token, f"server {nonce} {instance}".encode(), hashlib.sha256).hexdigest()


def session_key(token: bytes, instance: str) -> str:
    """What a client's calls carry in place of the token once `instance` proved it holds the
    token: whoever takes the server's address later learns a key of a server that is gone."""
    return hmac.new(token, f"client {instance}".encode(), hashlib.sha256).hexdigest()


def as_bytes_view(part: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(part)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def chunks(parts: Sequence[bytes | bytearray | memoryview]) -> Iterator[bytes]:
    """The parts cut into messages of at most CHUNK_BYTES, copying one chunk at a time."""
    for part in parts:
        view = as_bytes_view(part)
        for start in range(0, len(view), CHUNK_BYTES):
            yield bytes(view[start:start + CHUNK_BYTES])


def assemble(pieces: Iterable[bytes], size: int) -> bytearray:
    """Chunks joined into one buffer, which grows as they arrive: a peer that announces a huge
    size and sends nothing costs nothing (large reallocations grow in place, without a copy)."""
    buffer = bytearray()
    for piece in pieces:
        if len(buffer) + len(piece) > size:
            raise ValueError(f"the sender announced {size} bytes but sent more")
        buffer += piece
    if len(buffer) != size:
        raise ValueError(f"the sender announced {size} bytes but sent {len(buffer)}")
    return buffer
