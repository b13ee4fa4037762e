"""The smallest program: one node that greets and returns. Written as a Launchpad user writes
it; only the import names jaxdist.

    python experiments/launchpad/hello_world.py [--lp_launch_type=local_mt|local_mp]
"""

from absl import app

import jaxdist.compat.launchpad as lp


class Greeter:
    """Prints a greeting from its node, then returns: the program is over."""

    def run(self) -> None:
        print("hello from a launchpad node")


def make_program() -> lp.Program:
    program = lp.Program("hello_world")
    program.add_node(lp.PyClassNode(Greeter), label="greeter")
    return program


def main(argv):
    if len(argv) > 1:
        raise app.UsageError("Too many command-line arguments.")
    lp.launch(make_program())


if __name__ == "__main__":
    app.run(main)
