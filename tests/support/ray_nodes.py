"""Node classes for the ray launcher's tests; a module of its own so actors and node processes import it."""

from __future__ import annotations

import os


class Reporter:
    """Serves what a test asks about where it runs: its pid and its environment."""

    def pid(self) -> int:
        return os.getpid()

    def env(self, name: str) -> str | None:
        return os.environ.get(name)
