"""How a launch fails, as the launchers, the run lock and a program's caller see it."""

from __future__ import annotations


class NodeFailedError(RuntimeError):
    """A node raised or died; the message names it and carries its traceback."""

    def __init__(self, node_name: str, details: str) -> None:
        super().__init__(f"node '{node_name}' failed:\n{details}")
        self.node_name = node_name
        self.details = details

    @property
    def headline(self) -> str:
        """The failure in one line: what the launcher saw (``crashed 3 times, ...``), if it said,
        and the exception the node ended with: the first unindented line after the traceback's
        last frame (JAX appends a note below it; a message may run over several lines)."""
        lines = [line.rstrip() for line in self.details.strip().splitlines()] or ["no details"]
        frames = [i for i, line in enumerate(lines) if line.startswith("  File ")]
        after = lines[frames[-1] + 1:] if frames else lines
        exception = next((line for line in after if line and not line.startswith(" ")), lines[-1])
        what = [] if lines[0].startswith("Traceback") or lines[0] == exception else [lines[0]]
        return " ".join([*what, exception])


class LaunchError(ValueError):
    """A launch refused before its program ran: its arguments, or what it detected of the hosts,
    do not make a launch (the message says what to change)."""
