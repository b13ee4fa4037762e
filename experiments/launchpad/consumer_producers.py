"""A consumer asking producers for work through futures, then stopping the program.

    python experiments/launchpad/consumer_producers.py [local_mt|local_mp]
"""

import sys

import jaxdist.compat.launchpad as lp


class Producer:
    def work(self, context: int) -> int:
        return context * context


class Consumer:
    def __init__(self, producers) -> None:
        self._producers = producers

    def run(self) -> None:
        for step in range(3):
            pending = [producer.futures.work(step + i) for i, producer in enumerate(self._producers)]
            print(f"step {step} results {[future.result() for future in pending]}", flush=True)
        lp.stop()


def make_program(num_producers: int) -> lp.Program:
    program = lp.Program("consumer_producers")
    with program.group("producer"):
        producers = [program.add_node(lp.CourierNode(Producer)) for _ in range(num_producers)]
    program.add_node(lp.CourierNode(Consumer, producers=producers), label="consumer")
    return program


if __name__ == "__main__":
    lp.launch(make_program(3), launch_type=sys.argv[1] if len(sys.argv) > 1 else "local_mt")
