"""absl in Launchpad programs: the launching process's flags and logging, as each node sees them.

Launchpad starts every node's process with the launcher's command line and absl's logging
handler, so a node reads the script's flags and its `logging.info` lines are shown. The compat
nodes carry the same (`capture` at launch) and set it up where they run (`enter_node`): the
flags parsed from the launcher's command line, absl's handler and verbosity as the launcher had
them, and
that handler writing to the `sys.stderr` of the moment, which is the node's own log (and the
console, prefixed) under both the threads and the processes launcher. absl's handler keeps the
stderr it found at import otherwise, which bypasses the node's log.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import sys

from absl import flags
from absl import logging as absl_logging


@dataclasses.dataclass(frozen=True)
class AbslState:
    """The launching process's command line (None when it never parsed its flags), whether
    absl's logging handler served it (``app.run`` installs it) and absl's verbosity there."""

    argv: tuple[str, ...] | None
    handler: bool
    verbosity: int


def capture() -> AbslState:
    argv = tuple(sys.argv) if flags.FLAGS.is_parsed() else None
    return AbslState(argv, absl_logging.get_absl_handler() in logging.root.handlers, absl_logging.get_verbosity())


def enter_node(state: AbslState | None) -> None:
    """Where a node runs, before it is built: its flags and its logging as the launcher had them."""
    if state is None:
        return
    if state.argv is not None and not flags.FLAGS.is_parsed():
        flags.FLAGS(list(state.argv), known_only=True)
    if state.handler:
        absl_logging.use_absl_handler()
    absl_logging.set_verbosity(state.verbosity)
    handler = absl_logging.get_absl_handler().python_handler
    if handler.stream in (sys.__stderr__, sys.stderr) or isinstance(handler.stream, _CurrentStderr):
        handler.stream = _CurrentStderr()  # not a log file the user chose


class _CurrentStderr(io.TextIOBase):
    """Writes to whatever `sys.stderr` is when written to: a node's routed output."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()
