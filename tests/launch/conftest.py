"""The one Ray cluster of the run, for every Ray test below (a session fixture defined once:
imported into each module instead, it would start a cluster per module)."""

from ray_cluster import cluster  # noqa: F401 - the fixture
