"""Rate limiters in Reverb's sense: pure decisions over a table's counters, no threads, no waits.

With ``d = inserts * samples_per_insert - samples`` (counters over the table's life, or since its
last ``reset()``; ``size`` is the items it holds, inserts minus removals, as Reverb counts it):

- an insert of n may proceed while the table would still hold <= ``min_size`` items (filling up
  is free), or when ``(inserts + n) * samples_per_insert - samples <= max_diff``;
- a sample of n may proceed when the table holds >= ``min_size`` items and ``d - n >= min_diff``.

Inserters and samplers each wait for the other, so a badly set window would let both wait
forever. ``SampleToInsertRatio`` refuses what Reverb refuses: a window narrower than ``2 *
max(1, samples_per_insert)``, and a window whose lower edge lies above ``samples_per_insert *
min_size`` (samplers would stay blocked once inserts stop being free at ``min_size``). A sample
larger than the window is not refused: the table serves it as inserts arrive (see
``tables.py``). ``Queue`` and ``Stack`` are the limiters of Reverb's ``Table.queue`` and
``Table.stack``: used with a table that removes every item it samples, they block samples while
the table is empty and inserts while it is full.
"""

from __future__ import annotations

import math


class RateLimiter:
    """The general rule; ``MinSize``, ``SampleToInsertRatio``, ``Queue`` and ``Stack`` set it."""

    def __init__(self, samples_per_insert: float, min_size: int, min_diff: float, max_diff: float) -> None:
        if not isinstance(min_size, int) or isinstance(min_size, bool) or min_size < 1:
            raise ValueError(f"min_size must be an int >= 1, got {min_size!r}")
        if not samples_per_insert > 0:
            raise ValueError(f"samples_per_insert must be > 0, got {samples_per_insert!r}")
        if not min_diff <= max_diff:
            raise ValueError(f"min_diff ({min_diff}) must be <= max_diff ({max_diff})")
        self.samples_per_insert = float(samples_per_insert)
        self.min_size = min_size
        self.min_diff = float(min_diff)
        self.max_diff = float(max_diff)

    def can_insert(self, n: int, *, size: int, inserts: int, samples: int) -> bool:
        if size + n <= self.min_size:
            return True
        return (inserts + n) * self.samples_per_insert - samples <= self.max_diff

    def can_sample(self, n: int, *, size: int, inserts: int, samples: int) -> bool:
        return n <= self.sample_allowance(size=size, inserts=inserts, samples=samples)

    def sample_allowance(self, *, size: int, inserts: int, samples: int) -> float:
        """How many samples may proceed now (0 below ``min_size``; may be ``inf``)."""
        if size < self.min_size:
            return 0
        allowance = inserts * self.samples_per_insert - samples - self.min_diff
        return max(0, allowance if math.isinf(allowance) else math.floor(allowance + 1e-9))

    @property
    def max_sample_batch(self) -> float:
        """The largest batch one sample call is guaranteed to get at once (may be ``inf``);
        a larger one is served as inserts arrive."""
        window = self.max_diff - self.min_diff - self.samples_per_insert
        return window if math.isinf(window) else math.floor(window)

    @property
    def max_insert_batch(self) -> float:
        """The largest batch one insert call can ever be admitted with (may be ``inf``)."""
        spi = self.samples_per_insert
        room = (self.max_diff - self.min_diff - max(1.0, spi)) / spi
        return room if math.isinf(room) else math.floor(room + 1e-9)

    def __repr__(self) -> str:
        return (f"RateLimiter(samples_per_insert={self.samples_per_insert}, min_size={self.min_size}, "
                f"min_diff={self.min_diff}, max_diff={self.max_diff})")


class MinSize(RateLimiter):
    """Samplers wait until the table holds ``min_size`` items; nothing else is limited."""

    def __init__(self, min_size: int) -> None:
        super().__init__(1.0, min_size, -math.inf, math.inf)

    def __repr__(self) -> str:
        return f"MinSize({self.min_size})"


class SampleToInsertRatio(RateLimiter):
    """Keeps samples close to ``samples_per_insert`` times the inserts, once ``min_size`` is reached.

    ``error_buffer`` is the tolerance either side of the target, centred where the table first
    reaches ``min_size`` (so samplers may start at once); a ``(min_diff, max_diff)`` pair sets the
    window directly, as in Reverb, and is refused where Reverb refuses it (see the module doc).
    """

    def __init__(self, samples_per_insert: float, min_size: int,
                 error_buffer: float | tuple[float, float]) -> None:
        if isinstance(error_buffer, (tuple, list)):
            min_diff, max_diff = error_buffer
        else:
            offset = samples_per_insert * min_size
            min_diff, max_diff = offset - error_buffer, offset + error_buffer
        self._error_buffer = error_buffer
        super().__init__(samples_per_insert, min_size, min_diff, max_diff)
        if max_diff - min_diff < 2 * max(1.0, samples_per_insert) * (1 - 1e-12):  # forgive rounding
            raise ValueError(
                f"the window max_diff - min_diff = {max_diff - min_diff} must be >= "
                f"2 * max(1, samples_per_insert) = {2 * max(1.0, samples_per_insert)}, "
                "or inserts and samples could block each other forever; widen error_buffer")
        if min_diff > samples_per_insert * min_size:
            raise ValueError(
                f"the window's lower edge min_diff = {min_diff} is above samples_per_insert * min_size = "
                f"{samples_per_insert * min_size}: once min_size items are in, inserts wait for samples and "
                "samples for inserts, forever; lower min_diff or pass a symmetric error_buffer")

    def __repr__(self) -> str:
        return (f"SampleToInsertRatio(samples_per_insert={self.samples_per_insert}, "
                f"min_size={self.min_size}, error_buffer={self._error_buffer!r})")


class Queue(RateLimiter):
    """Reverb's queue limiter: with a table that removes what it samples (``max_times_sampled=1``),
    samples wait while it is empty and inserts while it holds ``size`` items."""

    def __init__(self, size: int) -> None:
        super().__init__(1.0, 1, 0.0, float(size))
        self.size = size

    @property
    def max_sample_batch(self) -> int:
        return self.size  # every sample removes an item, so a full table serves a batch of its size

    @property
    def max_insert_batch(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.size})"


class Stack(Queue):
    """Reverb's stack limiter: the same rule as ``Queue``, for a table sampled newest first."""
