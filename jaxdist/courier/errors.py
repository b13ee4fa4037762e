"""Exceptions a courier caller can see, and how remote exceptions cross the wire.

A server-side exception of a builtin type (ValueError, KeyError, ...) is raised again on the
caller as that same type, so `except KeyError` works across processes; anything else becomes a
`RemoteError`. Either way the message carries the remote traceback.
"""

from __future__ import annotations

import builtins
import traceback
from typing import Any


class CourierError(Exception):
    """Base class of the errors courier itself raises."""


class RemoteError(CourierError):
    """A remote exception whose type is not a builtin, so it cannot be rebuilt here."""


class UnknownMethodError(CourierError, AttributeError):
    """The server exposes no method of that name."""


class MalformedMessageError(CourierError, ValueError):
    """A peer sent bytes that are not a valid courier message."""


class MessageTooLargeError(CourierError):
    """A message exceeded the receiver's size limit."""


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
    if builtin:
        try:
            exc = getattr(builtins, type_name)(text)
        except Exception:  # a builtin whose constructor wants more arguments
            exc = RemoteError(f"{type_name}: {text}")
    else:
        exc = RemoteError(f"{type_name}: {text}")
    exc.remote_traceback = remote_traceback
    return exc


def _is_rebuildable_builtin(exc_type: type) -> bool:
    """Only ordinary builtin exceptions cross: a remote SystemExit must not exit the caller."""
    return (
        exc_type.__module__ == "builtins"
        and issubclass(exc_type, Exception)
        and getattr(builtins, exc_type.__name__, None) is exc_type
    )
