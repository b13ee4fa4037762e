"""Launchpad's smallest program, as a Launchpad user writes it; only the import names jaxdist.

    python experiments/launchpad/hello_world.py [local_mt|local_mp]
"""

import sys

import jaxdist.compat.launchpad as lp


class Greeter:
    def run(self) -> None:
        print("hello from a launchpad node", flush=True)


def make_program() -> lp.Program:
    program = lp.Program("hello_world")
    program.add_node(lp.PyClassNode(Greeter), label="greeter")
    return program


if __name__ == "__main__":
    lp.launch(make_program(), launch_type=sys.argv[1] if len(sys.argv) > 1 else "local_mt")
