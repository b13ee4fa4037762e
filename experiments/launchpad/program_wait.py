"""Nodes that wait for the stop in each of Launchpad's ways, a node that stops the program, and
the launcher waiting for it to end, three times over.

    python experiments/launchpad/program_wait.py [local_mt|local_mp]
"""

import sys
import time

import jaxdist.compat.launchpad as lp


def polls_for_stop() -> None:
    while not lp.wait_for_stop(0.2):
        pass
    print("polls_for_stop: clean exit", flush=True)


def waits_for_stop() -> None:
    lp.wait_for_stop()
    print("waits_for_stop: clean exit", flush=True)


def waits_on_event() -> None:
    lp.stop_event().wait()
    print("waits_on_event: clean exit", flush=True)


def has_stop_handler() -> None:
    lp.register_stop_handler(lambda: print("stop handler called", flush=True))
    lp.wait_for_stop()


def stops_program() -> None:
    time.sleep(1.0)
    lp.stop()


def make_program() -> lp.Program:
    program = lp.Program("program_wait")
    for function in (polls_for_stop, waits_for_stop, waits_on_event, has_stop_handler, stops_program):
        program.add_node(lp.CourierNode(function), label=function.__name__)
    return program


if __name__ == "__main__":
    for attempt in range(3):
        controller = lp.launch(make_program(), launch_type=sys.argv[1] if len(sys.argv) > 1 else "local_mt")
        controller.wait()
        print(f"program finished {attempt}", flush=True)
