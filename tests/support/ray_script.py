"""A script that launches a program on the Ray cluster at argv[1] and waits for it (a SIGTERM
test sends it the signal once it prints "running")."""

from __future__ import annotations

import sys

import jaxdist as jd
import launch_nodes as nodes


def main() -> None:
    program = jd.Program("signalled")
    with program.group("counter"):
        program.add_node(jd.CourierNode(nodes.Counter))
    with program.group("worker"):
        program.add_node(jd.CourierNode(nodes.UntilStopped))
    running = jd.launch(program, launcher="ray", address=sys.argv[1], run_dir=sys.argv[2], echo=False)
    print("running", flush=True)
    running.wait()
    print(f"stopped: {running.stop_reason}", flush=True)


if __name__ == "__main__":
    main()
