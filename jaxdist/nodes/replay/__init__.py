"""Replay: in-process tables and rate limiters, and the ReplayNode that serves them over RPC."""

from jaxdist.nodes.replay.client import (ReplayClient, SampleTimeoutError, sample_many, try_again_kind,
                                         update_priorities_many)
from jaxdist.nodes.replay.node import ReplayNode
from jaxdist.nodes.replay.priorities import PriorityWriter
from jaxdist.nodes.replay.rate_limiters import MinSize, Queue, RateLimiter, SampleToInsertRatio, Stack
from jaxdist.nodes.replay.tables import (Fifo, Lifo, MaxHeap, MinHeap, Prioritized, Sample, SampleInfo, Table,
                                         TableClosedError, TableSpec, Uniform, insert_into)

__all__ = ["Fifo", "Lifo", "MaxHeap", "MinHeap", "MinSize", "Prioritized", "PriorityWriter", "Queue", "RateLimiter",
           "ReplayClient", "ReplayNode", "Sample", "SampleInfo", "SampleTimeoutError", "SampleToInsertRatio", "Stack",
           "Table", "TableClosedError", "TableSpec", "Uniform", "insert_into", "sample_many", "try_again_kind",
           "update_priorities_many"]
