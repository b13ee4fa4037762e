"""What a caller builds from a remote error report: only exception classes it allows itself.

A hostile server (a process that took a dead node's port, or a man in the middle) answers every
call with an error report of its choosing; the client must never run, exit or build anything
the report names beyond its own allow-list of builtin exceptions.
"""

from __future__ import annotations

import contextlib
from concurrent import futures
from typing import Iterator

import grpc
import pytest

from jaxdist import courier
from jaxdist.courier import codec, wire
from jaxdist.courier.errors import describe_exception


@contextlib.contextmanager
def server_answering(report: dict) -> Iterator[courier.Client]:
    """A raw gRPC server on loopback that answers every courier call with this error report."""
    def answer(request: bytes, context: grpc.ServicerContext) -> bytes:
        return wire.ERROR + codec.encode(report)

    handler = grpc.method_handlers_generic_handler(wire.SERVICE, {"m": grpc.unary_unary_rpc_method_handler(answer)})
    raw = grpc.server(futures.ThreadPoolExecutor(2), handlers=[handler])
    port = raw.add_insecure_port("127.0.0.1:0")
    raw.start()
    try:
        with courier.Client(f"127.0.0.1:{port}", timeout=10) as client:
            yield client
    finally:
        raw.stop(0)


@pytest.mark.parametrize("type_name", [
    "exec", "eval", "exit", "quit", "print", "open", "__import__", "breakpoint", "input", "compile",
    "SystemExit", "KeyboardInterrupt", "GeneratorExit", "BaseException", "StopIteration",
    "StopAsyncIteration", "UserWarning", "RemoteError", "object", "type", "no_such_name",
])
def test_a_report_naming_anything_but_an_allowed_builtin_exception_becomes_remote_error(tmp_path, type_name):
    marker = tmp_path / "ran"
    # Valid Python around the "\n\nRemote traceback ..." the client inserts: exec would run it.
    report = {"type": type_name, "builtin": True, "message": f"open({str(marker)!r}, 'w').close(); '''",
              "traceback": "'''"}
    with server_answering(report) as client:
        with pytest.raises(courier.RemoteError) as raised:
            client.m()
        with pytest.raises(courier.RemoteError):
            client.futures.m().result(timeout=10)
    assert type(raised.value) is courier.RemoteError
    assert str(raised.value).startswith(f"{type_name}: ")
    assert not marker.exists()


@pytest.mark.parametrize("exc_type", [ValueError, KeyError, TypeError, ZeroDivisionError, FileNotFoundError,
                                      TimeoutError, NotImplementedError, RuntimeError])
def test_allowed_builtin_exceptions_come_back_as_themselves_with_the_remote_traceback(exc_type):
    try:
        raise exc_type("remote words")
    except exc_type as exc:
        report = describe_exception(exc)
    with server_answering(report) as client:
        with pytest.raises(exc_type) as raised:
            client.m()
    assert type(raised.value) is exc_type
    assert "remote words" in str(raised.value) and "Remote traceback (m on 127.0.0.1:" in str(raised.value)
    assert "raise exc_type" in raised.value.remote_traceback


def test_a_report_not_claiming_builtin_or_with_a_constructor_it_cannot_call_becomes_remote_error():
    with server_answering({"type": "ValueError", "builtin": False, "message": "m", "traceback": "t"}) as client:
        with pytest.raises(courier.RemoteError, match="^ValueError: m"):
            client.m()
    with server_answering({"type": "UnicodeDecodeError", "builtin": True, "message": "m", "traceback": "t"}) as client:
        with pytest.raises(courier.RemoteError, match="^UnicodeDecodeError: m"):
            client.m()


def test_a_user_class_named_like_a_builtin_is_not_reported_as_builtin():
    class ValueError(Exception):  # noqa: A001 - the point: same name, not the builtin
        pass

    assert describe_exception(ValueError("x"))["builtin"] is False
    assert describe_exception(SystemExit(1))["builtin"] is False
    assert describe_exception(KeyError("k"))["builtin"] is True
