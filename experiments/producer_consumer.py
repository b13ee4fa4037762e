"""Producer/consumer (Launchpad paper, listing 2): a consumer fans work out to producers with futures.

    python experiments/producer_consumer.py --launcher processes --num-producers 4
"""

from __future__ import annotations

import argparse

import jaxdist as jd


class Producer:
    def work(self, context: int) -> int:
        return context * context


class Consumer:
    def __init__(self, producers: list) -> None:
        self._producers = producers

    def run(self) -> None:
        futures = [producer.futures.work(i) for i, producer in enumerate(self._producers)]
        results = [future.result() for future in futures]
        print("Results:", results, flush=True)
        jd.stop()


def make_program(num_producers: int) -> jd.Program:
    program = jd.Program("producer_consumer")
    with program.group("producer"):
        producers = [program.add_node(jd.CourierNode(Producer)) for _ in range(num_producers)]
    program.add_node(jd.CourierNode(Consumer, producers=producers), label="consumer")
    return program


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launcher", choices=["threads", "processes"], default="processes")
    parser.add_argument("--num-producers", type=int, default=4)
    parser.add_argument("--run-dir", default=None, help="logs go to <run-dir>/logs (default runs/producer_consumer)")
    args = parser.parse_args()
    jd.launch(make_program(args.num_producers), launcher=args.launcher, run_dir=args.run_dir).wait()


if __name__ == "__main__":
    main()
