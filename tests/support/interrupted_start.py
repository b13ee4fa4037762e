"""A launch that a Ctrl-C at the terminal interrupts while its nodes start: every spawned node
imports this file again as its main module (the spawn start method), and here that import is
slow, as an agent script's is (JAX and the rest load). Prints one line when interrupted.

    python interrupted_start.py RUN_DIR MARKER_FILE
"""

from __future__ import annotations

import os
import sys
import time

if __name__ == "__mp_main__":  # a node starting: say so, then take a while, as heavy imports do
    with open(os.environ["JAXDIST_TEST_STARTING"], "a") as marker:
        marker.write(f"{os.getpid()}\n")
    time.sleep(5.0)

import jaxdist as jd  # noqa: E402
import launch_nodes  # noqa: E402

if __name__ == "__main__":
    program = jd.Program("interrupted")
    with program.group("service"):
        program.add_node(jd.CourierNode(launch_nodes.Counter))
    try:
        jd.launch(program, launcher="processes", run_dir=sys.argv[1]).stop()
        print("started")
    except KeyboardInterrupt:
        print("interrupted while starting")
