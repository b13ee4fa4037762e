"""Busy processes that keep the machine's cores loaded while the tests run, so that a race or a
timing that load exposes shows up here and not first in CI (``--cpu-burners N`` or
``JAXDIST_TEST_CPU_BURNERS=N``)."""

from __future__ import annotations

import subprocess
import sys

BURN = """
import os
parent = os.getppid()
while os.getppid() == parent:  # ends once the test run that started it is gone, however it ended
    for _ in range(200_000):
        pass
"""


def start(count: int) -> list[subprocess.Popen]:
    """``count`` processes, each spinning one core at the tests' own priority."""
    return [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(count)]


def stop(burners: list[subprocess.Popen]) -> None:
    for burner in burners:
        burner.kill()
        burner.wait()
