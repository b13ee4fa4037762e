"""A consumer asks producers for work through futures, a few steps, then stops the program.
Written as a Launchpad user writes it; only the import names jaxdist.

    python experiments/launchpad/consumer_producers.py [--num_producers=3] [--lp_launch_type=local_mp]
"""

from absl import app
from absl import flags
from absl import logging

import jaxdist.compat.launchpad as lp

_NUM_PRODUCERS = flags.DEFINE_integer("num_producers", 3, "How many producers the consumer asks.")
_STEPS = flags.DEFINE_integer("steps", 3, "How many rounds of work the consumer asks for.")


class Producer:
    def work(self, context: int) -> int:
        return context * context


class Consumer:
    def __init__(self, producers) -> None:
        self._producers = producers

    def run(self) -> None:
        for step in range(_STEPS.value):  # a flag, read inside the node
            self.step(step)
        lp.stop()  # returning alone would leave the producers serving

    def step(self, step: int) -> list[int]:
        pending = [producer.futures.work(step + i) for i, producer in enumerate(self._producers)]
        results = [future.result() for future in pending]
        logging.info("step %d results %s", step, results)
        return results


def make_program(num_producers: int) -> lp.Program:
    program = lp.Program("consumer_producers")
    with program.group("producer"):
        producers = [program.add_node(lp.CourierNode(Producer)) for _ in range(num_producers)]
    program.add_node(lp.CourierNode(Consumer, producers=producers), label="consumer")
    return program


def main(argv):
    if len(argv) > 1:
        raise app.UsageError("Too many command-line arguments.")
    lp.launch(make_program(_NUM_PRODUCERS.value))


if __name__ == "__main__":
    app.run(main)
