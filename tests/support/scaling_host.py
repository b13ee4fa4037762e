"""One host of a two-host `launch_nodes.scalable_program()` whose ``worker`` group is spread:
each line on stdin is a size the group scales to here, answered with ``scaled <names>``; at the
end of stdin the host waits for the program's stop (another host's, told over the control ports).

    python scaling_host.py --hosts 127.0.0.1,127.0.0.1 --host-index 1 --base-port 40000 --run-dir DIR
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jaxdist as jd  # noqa: E402
import launch_nodes  # noqa: E402
from jaxdist.launch import hosts  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    hosts.add_arguments(parser)
    parser.add_argument("--run-dir", required=True)
    args = parser.parse_args()
    running = jd.launch(launch_nodes.scalable_program(), launcher="multihost", run_dir=args.run_dir, echo=False,
                        grace=3.0, token="shared", distributed=None, placement={"worker": jd.spread()},
                        **hosts.from_args(args))
    print("host up", flush=True)
    for line in sys.stdin:
        print(f"scaled {json.dumps(running.scale('worker', int(line)))}", flush=True)
    running.wait()


if __name__ == "__main__":
    main()
