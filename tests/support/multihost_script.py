"""One host's share of a two-host test program: run once per host with --host-index.

    python multihost_script.py --hosts 127.0.0.1,127.0.0.1 --host-index 1 --base-port 40000 \
        --run-dir DIR [--mode calls|forever|idle] [--print-plan]

Callers call the service on host 0 25 times each (calls), until the program stops (forever), or
not at all (idle: the hosts' launchers are all that talk between hosts).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jaxdist as jd  # noqa: E402
import multihost_nodes as nodes  # noqa: E402
from jaxdist.launch import hosts, placement  # noqa: E402
from jaxdist.launch.launchers import multihost  # noqa: E402

PLACEMENT = {"service": placement.on_host(0), "caller": placement.spread()}


def build(mode: str, callers: int, calls: int) -> jd.Program:
    program = jd.Program(f"multihost-{mode}")
    with program.group("service"):
        counter = program.add_node(jd.CourierNode(nodes.Counter))
    with program.group("caller"):
        for _ in range(callers):
            if mode == "calls":
                program.add_node(jd.CourierNode(nodes.Caller, counter, calls, callers * calls))
            elif mode == "forever":
                program.add_node(jd.CourierNode(nodes.ForeverCaller, counter))
            else:
                program.add_node(jd.PyNode(nodes.idle))
    return program


def main() -> None:
    parser = argparse.ArgumentParser()
    hosts.add_arguments(parser)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--mode", choices=["calls", "forever", "idle"], default="calls")
    parser.add_argument("--callers", type=int, default=4)
    parser.add_argument("--calls", type=int, default=25)
    parser.add_argument("--print-plan", action="store_true")
    args = parser.parse_args()
    program = build(args.mode, args.callers, args.calls)
    options = dict(hosts.from_args(args), placement=PLACEMENT)
    if args.print_plan:
        plan = multihost.plan_for(program, **options)
        print(json.dumps({"addresses": plan.addresses, "host_of": plan.host_of, "coordinator": plan.coordinator,
                          "controls": plan.controls}))
        return
    restart = {"caller": jd.Restart(max_restarts=3, backoff=0.1)} if args.mode == "forever" else None
    running = jd.launch(program, launcher="multihost", run_dir=args.run_dir, grace=5.0, restart=restart, **options)
    pids = {name: status["pid"] for name, status in running.status().items()}
    print(f"host {running.host_index} running pids {json.dumps(pids)}", flush=True)
    running.wait()
    print(f"host {running.host_index} finished: {running.stop_reason}", flush=True)


if __name__ == "__main__":
    main()
