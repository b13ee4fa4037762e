"""Rate limiters in Reverb's sense: pure decisions over a table's counters, no threads, no waits.

With ``d = inserts * samples_per_insert - samples`` (counters over the table's whole life):

- an insert of n may proceed while the table would still hold <= ``min_size`` items (filling up
  is free), or when ``(inserts + n) * samples_per_insert - samples <= max_diff``;
- a sample of n may proceed when the table holds >= ``min_size`` items and ``d - n >= min_diff``.

Inserters and samplers each wait for the other, so a badly sized window would let both wait
forever. The constructors refuse windows narrower than ``2 * max(1, samples_per_insert)`` (as
Reverb does), and ``check_sample_batch`` refuses a batch that no sequence of inserts can unblock:
a sample of n and an insert are both blocked exactly when ``max_diff - spi < d < min_diff + n``,
which cannot happen while ``n <= max_diff - min_diff - spi``.
"""

from __future__ import annotations

import math


class RateLimiter:
    """The general rule; ``MinSize`` and ``SampleToInsertRatio`` are the two ways to set it."""

    def __init__(self, samples_per_insert: float, min_size: int, min_diff: float, max_diff: float) -> None:
        if not isinstance(min_size, int) or min_size < 1:
            raise ValueError(f"min_size must be an int >= 1, got {min_size!r}")
        if not samples_per_insert > 0:
            raise ValueError(f"samples_per_insert must be > 0, got {samples_per_insert!r}")
        if max_diff - min_diff < 2 * max(1.0, samples_per_insert) * (1 - 1e-12):  # forgive rounding
            raise ValueError(
                f"the window max_diff - min_diff = {max_diff - min_diff} must be >= "
                f"2 * max(1, samples_per_insert) = {2 * max(1.0, samples_per_insert)}, "
                "or inserts and samples could block each other forever; widen error_buffer")
        self.samples_per_insert = float(samples_per_insert)
        self.min_size = min_size
        self.min_diff = float(min_diff)
        self.max_diff = float(max_diff)

    def can_insert(self, n: int, *, size: int, inserts: int, samples: int) -> bool:
        if size + n <= self.min_size:
            return True
        return (inserts + n) * self.samples_per_insert - samples <= self.max_diff

    def can_sample(self, n: int, *, size: int, inserts: int, samples: int) -> bool:
        return size >= self.min_size and inserts * self.samples_per_insert - samples - n >= self.min_diff

    @property
    def max_sample_batch(self) -> float:
        """The largest batch that one sample call can be guaranteed to get (may be ``inf``)."""
        window = self.max_diff - self.min_diff - self.samples_per_insert
        return window if math.isinf(window) else math.floor(window)

    def check_sample_batch(self, n: int) -> None:
        if n > self.max_sample_batch:
            raise ValueError(
                f"batch_size {n} can never be sampled at once under {self!r}: its window allows at "
                f"most {self.max_sample_batch} samples per call (max_diff - min_diff - "
                "samples_per_insert); widen error_buffer or sample smaller batches")

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
    window directly, as in Reverb.
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

    def __repr__(self) -> str:
        return (f"SampleToInsertRatio(samples_per_insert={self.samples_per_insert}, "
                f"min_size={self.min_size}, error_buffer={self._error_buffer!r})")
