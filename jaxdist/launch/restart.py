"""Restart policies: which crashed nodes the processes launcher brings back, how often, how fast."""

from __future__ import annotations

import dataclasses

from jaxdist.program import Program


@dataclasses.dataclass(frozen=True)
class Restart:
    """Bring a crashed node back up to `max_restarts` times in a row, waiting `backoff` seconds
    before the first restart and doubling up to `max_backoff`. A node that then stays up for
    `reset_after` seconds is healthy again: its next crash starts a fresh count and backoff (a
    learner preempted now and then over days is not a crash loop). A node that exits cleanly is
    never restarted; one that crashes past its limit stops the program."""

    max_restarts: int = 3
    backoff: float = 1.0
    max_backoff: float = 30.0
    reset_after: float | None = 60.0

    def __post_init__(self) -> None:
        if self.max_restarts < 0 or self.backoff < 0 or self.max_backoff < self.backoff or \
                (self.reset_after is not None and self.reset_after <= 0):
            raise ValueError(f"invalid restart policy {self}: need max_restarts >= 0, 0 <= backoff <= max_backoff, "
                             f"reset_after None or > 0")

    def delay(self, restarts_so_far: int) -> float:
        """Seconds before the next restart: ``backoff`` doubled per restart in a row, capped."""
        return min(self.max_backoff, self.backoff * 2**restarts_so_far)


NEVER = Restart(max_restarts=0)


def policies(program: Program, restart: dict[str, Restart] | None) -> dict[str, Restart]:
    """The policy of every unit by name: the group's from `restart`, else its node type's default."""
    restart = dict(restart or {})
    unknown = sorted(set(restart) - set(program.groups))
    if unknown:
        raise ValueError(
            f"restart names groups {unknown} that program '{program.name}' does not have; "
            f"groups: {', '.join(sorted(program.groups))}"
        )
    for label, policy in restart.items():
        if not isinstance(policy, Restart):
            raise TypeError(f"restart['{label}'] must be a jd.Restart, got {policy!r}")
    resolved = {}
    for label, unit in program.units():
        resolved[unit.name] = restart.get(label) or unit.default_restart() or NEVER
    return resolved
