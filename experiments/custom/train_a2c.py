"""A2C, an agent of one's own, trained like the library's: every field of ``A2CConfig`` is a
flag, on either architecture.

    PYTHONPATH=experiments/custom python experiments/custom/train_a2c.py --stop-at-target
    PYTHONPATH=experiments/custom python experiments/custom/train_a2c.py --architecture anakin
"""

from __future__ import annotations

import time

START = time.time()

import a2c  # noqa: E402
from jaxdist.agents import run  # noqa: E402

if __name__ == "__main__":
    run.main(a2c.agent, a2c.A2CConfig, a2c.PRESETS, __doc__, START)
