"""In-process replay tables and rate limiters, served over RPC by a ReplayNode."""

from jaxdist.nodes.replay.rate_limiters import MinSize, RateLimiter, SampleToInsertRatio
from jaxdist.nodes.replay.tables import Fifo, Prioritized, Sample, TableClosedError, Uniform

__all__ = ["Fifo", "MinSize", "Prioritized", "RateLimiter", "Sample", "SampleToInsertRatio", "TableClosedError",
           "Uniform"]
