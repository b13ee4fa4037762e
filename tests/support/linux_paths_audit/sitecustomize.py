"""Imported first by every Python process of a test run with this folder on PYTHONPATH: an audit
hook records each Linux-only path (/proc, /sys) that jaxdist's own code opens or lists, into the
file named by $JAXDIST_LINUX_PATHS_OUT. macOS has neither, so such a read breaks jaxdist there;
reads that psutil makes are its own to make portable (it has a macOS backend), and not counted."""

from __future__ import annotations

import os
import sys
import sysconfig

_OUT = os.environ.get("JAXDIST_LINUX_PATHS_OUT")
_STDLIB = sysconfig.get_paths()["stdlib"]
_EVENTS = {"open", "os.listdir", "os.scandir"}


def _caller() -> str:
    """The file that asked for the path: out through the standard library's wrappers (pathlib,
    io), to jaxdist or to a package such as psutil."""
    frame = sys._getframe(2)
    while frame is not None and (frame.f_code.co_filename.startswith(_STDLIB)
                                 or frame.f_code.co_filename.startswith("<frozen")):
        frame = frame.f_back
    return "" if frame is None else frame.f_code.co_filename


def _hook(event: str, args: tuple) -> None:
    if event not in _EVENTS or not args or not isinstance(args[0], (str, bytes)):
        return
    path = os.fsdecode(args[0])
    if not path.startswith(("/proc", "/sys")):
        return
    caller = _caller()
    if f"{os.sep}jaxdist{os.sep}" in caller and f"{os.sep}tests{os.sep}" not in caller:
        with open(_OUT, "a") as out:
            out.write(f"{os.getpid()} {event} {path} from {caller}\n")


if _OUT:
    sys.addaudithook(_hook)
