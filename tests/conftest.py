"""The run's harness: CPU burners on demand, keeping the machine's cores busy while the tests run."""

from __future__ import annotations

import os

import cpu_burners
import pytest

BURNERS_ENV = "JAXDIST_TEST_CPU_BURNERS"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-burners", type=int, default=int(os.environ.get(BURNERS_ENV, "0")), metavar="N",
                     help=f"keep N cores busy with spinning processes while the tests run (default ${BURNERS_ENV})")


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return  # an xdist worker: its controller started the burners
    burners = cpu_burners.start(config.getoption("cpu_burners"))
    config.add_cleanup(lambda: cpu_burners.stop(burners))


def pytest_report_header(config: pytest.Config) -> str | None:
    count = config.getoption("cpu_burners")
    return f"cpu burners: {count} spinning processes" if count else None
