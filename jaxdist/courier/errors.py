"""Exceptions a courier caller can see, and how remote exceptions cross the wire.

A server-side exception of a builtin type (ValueError, KeyError, ...) is raised again on the
caller as that same type, so `except KeyError` works across processes; anything else becomes a
`RemoteError`. Either way the message carries the remote traceback.

The caller decides what it builds: a report names a type, and the caller looks that name up in
its own allow-list of builtin exception classes (`REBUILDABLE`), never in `builtins` at large, so
a hostile peer cannot name `exec`, `exit`, `SystemExit` or `KeyboardInterrupt`.
"""

from __future__ import annotations

import builtins
import traceback
from typing import Any


# Builtin exceptions a report may name: ordinary errors only. BaseException-only types (SystemExit,
# KeyboardInterrupt, GeneratorExit) are not Exceptions; StopIteration would end a caller's loop
# silently; warnings are not errors.
REBUILDABLE: dict[str, type[Exception]] = {
    value.__name__: value
    for value in vars(builtins).values()
    if isinstance(value, type)
    and issubclass(value, Exception)
    and not issubclass(value, (StopIteration, StopAsyncIteration, Warning))
}


class CourierError(Exception):
    """Base class of the errors courier itself raises."""


class RemoteError(CourierError):
    """A remote exception whose type this caller does not rebuild (not in `REBUILDABLE`)."""


class UnknownMethodError(CourierError, AttributeError):
    """The server exposes no method of that name."""


class MalformedMessageError(CourierError, ValueError):
    """A peer sent bytes that are not a valid courier message."""


class MessageTooLargeError(CourierError):
    """A message exceeded the receiver's size limit."""


class ServerBusyError(CourierError):
    """The server refused the call for lack of room (calls in flight, uploads, staged bytes);
    the same call may pass later. Uploads wait for room within their deadline before this."""


class DeadlineExceededError(CourierError, TimeoutError):
    """The call got no answer within its deadline."""


class UnavailableError(CourierError, ConnectionError):
    """The server could not be reached."""


class AuthenticationError(CourierError, PermissionError):
    """The server refused the caller's token."""


def describe_exception(exc: BaseException) -> dict[str, Any]:
    """The wire form of an exception raised by a served method."""
    return {
        "type": type(exc).__name__,
        "builtin": _is_rebuildable_builtin(type(exc)),
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
    }


def rebuild_exception(description: Any, method: str, address: str) -> Exception:
    """The exception to raise on the caller for a remote one described by `describe_exception`."""
    try:
        type_name = str(description["type"])
        message = str(description["message"])
        remote_traceback = str(description["traceback"])
        builtin = description["builtin"] is True
    except (TypeError, KeyError):
        return MalformedMessageError(f"{method} on {address}: malformed error report {description!r}")
    text = f"{message}\n\nRemote traceback ({method} on {address}):\n{remote_traceback}"
    exc: Exception | None = None
    cls = REBUILDABLE.get(type_name) if builtin else None
    if cls is not None:
        try:
            exc = cls(text)
        except Exception:  # a builtin whose constructor wants more arguments (UnicodeDecodeError)
            exc = None
    if exc is None:
        exc = RemoteError(f"{type_name}: {text}")
    exc.remote_traceback = remote_traceback
    return exc


def _is_rebuildable_builtin(exc_type: type) -> bool:
    """Whether the sender vouches for a builtin: a user class named `ValueError` is not one."""
    return REBUILDABLE.get(exc_type.__name__) is exc_type
