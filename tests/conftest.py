"""The run's harness: one JAX compilation cache for the run, the long end-to-end tests first, and
CPU burners on demand, keeping the machine's cores busy while the tests run."""

from __future__ import annotations

import collections
import os
import shutil
import tempfile

import cpu_burners
import pytest

BURNERS_ENV = "JAXDIST_TEST_CPU_BURNERS"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-burners", type=int, default=int(os.environ.get(BURNERS_ENV, "0")), metavar="N",
                     help=f"keep N cores busy with spinning processes while the tests run (default ${BURNERS_ENV})")


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return  # an xdist worker: its controller made the cache and started the burners
    share_one_compilation_cache(config)
    burners = cpu_burners.start(config.getoption("cpu_burners"))
    config.add_cleanup(lambda: cpu_burners.stop(burners))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files with the most slow tests first, each file's own order kept: in a run of every test
    over several workers (`make test`: a file to a worker at a time, in this order) the long
    end-to-end runs start early, mixed with the short tests of their files, and the files of short
    tests fill the workers' last minutes, instead of one long test running alone at the end. (All
    the slow tests first, one at a time, measured slower: three end-to-end runs at once, each of
    several processes, cost more CPU in all than each beside short tests.)"""
    slow_tests = collections.Counter(item.path for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow_tests[item.path])


def share_one_compilation_cache(config: pytest.Config) -> None:
    """Every process of the run (the workers, and the nodes and scripts the tests start) shares one
    persistent compilation cache, new for the run: a relaunched or restarted run, a resumed segment
    and the tests that train the same agent load their long compilations instead of doing them
    again, and no run depends on what an earlier one left (JAX's default threshold: what took a
    second or more)."""
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return  # the caller's own
    directory = tempfile.mkdtemp(prefix="jaxdist-tests-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = directory
    config.add_cleanup(lambda: shutil.rmtree(directory, ignore_errors=True))


def pytest_report_header(config: pytest.Config) -> str | None:
    count = config.getoption("cpu_burners")
    return f"cpu burners: {count} spinning processes" if count else None
