"""Nodes that wait for the program's stop in each of Launchpad's ways, a node that stops the
program, and the launcher waiting for it to be over. Written as a Launchpad user writes it; only
the import names jaxdist.

    python experiments/launchpad/program_wait.py [--launches=2] [--lp_launch_type=local_mp]
"""

import threading

from absl import app
from absl import flags
from absl import logging

import jaxdist.compat.launchpad as lp

_LAUNCHES = flags.DEFINE_integer("launches", 1, "How many times to launch the program, one after another.")


def polls_for_stop() -> None:
    while not lp.wait_for_stop(0.2):
        logging.info("polls_for_stop: not yet")
    logging.info("polls_for_stop: clean exit")


def waits_for_stop() -> None:
    lp.wait_for_stop()
    logging.info("waits_for_stop: clean exit")


def waits_on_event() -> None:
    lp.stop_event().wait()
    logging.info("waits_on_event: clean exit")


def has_stop_handler() -> None:
    stopping = threading.Event()

    def handler() -> None:
        logging.info("stop handler called")
        stopping.set()

    lp.register_stop_handler(handler)
    stopping.wait()
    logging.info("has_stop_handler: clean exit")


def stops_program() -> None:
    lp.wait_for_stop(1.0)
    lp.stop()


def make_program() -> lp.Program:
    program = lp.Program("program_wait")
    for function in (polls_for_stop, waits_for_stop, waits_on_event, has_stop_handler, stops_program):
        program.add_node(lp.CourierNode(function), label=function.__name__)
    return program


def main(argv):
    if len(argv) > 1:
        raise app.UsageError("Too many command-line arguments.")
    for attempt in range(_LAUNCHES.value):
        controller = lp.launch(make_program())
        controller.wait()
        logging.info("program finished %d", attempt)


if __name__ == "__main__":
    app.run(main)
