"""Replay: in-process tables and rate limiters, and the ReplayNode that serves them over RPC."""

from jaxdist.nodes.replay.client import (ReplayClient, SampleTimeoutError, sample_many, try_again_kind,
                                         update_priorities_many)
from jaxdist.nodes.replay.node import ReplayNode
from jaxdist.nodes.replay.priorities import PriorityWriter
from jaxdist.nodes.replay.rate_limiters import MinSize, RateLimiter, SampleToInsertRatio
from jaxdist.nodes.replay.tables import (Fifo, Prioritized, Sample, Table, TableClosedError, TableSpec,
                                         Uniform)

__all__ = ["Fifo", "MinSize", "Prioritized", "PriorityWriter", "RateLimiter", "ReplayClient", "ReplayNode",
           "Sample", "SampleTimeoutError", "SampleToInsertRatio", "Table", "TableClosedError", "TableSpec", "Uniform",
           "sample_many", "try_again_kind", "update_priorities_many"]
