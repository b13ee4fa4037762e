"""One JAX compilation cache for the whole test run: the experiments a run launches compile the
same agents again and again, and each compiles them once. Made by ``tests/conftest.py`` before
any test module is imported (xdist's workers inherit it), removed at the end of the run."""

from __future__ import annotations

import os

ENV = "JAXDIST_TEST_JAX_CACHE"


def directory() -> str:
    """The run's cache directory, for ``--compilation-cache`` and ``resources(..., cache)``."""
    return os.environ[ENV]
