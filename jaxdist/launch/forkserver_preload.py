"""The forkserver's first preload: imported there alone, in its main thread, before JAX.

It prepares the forkserver itself, so that one started from any thread, or started again after
it died, is the same: it drops the ``JAX_*`` variables it inherited, so that its JAX holds its
defaults (each node process applies its own, `node_processes.Inheritance.take`), and it ignores
SIGINT and SIGTERM. Every node process is the forkserver's child and learns of its exit through
it: a Ctrl-C at the terminal, or a SIGTERM to every process of the job (a cluster's cancel), must
leave the nodes to the launcher, who stops the program in order. Its forks start ignoring SIGINT
too, until the worker takes it back once the node leads a process group of its own (a Ctrl-C
while they start is the launcher's); they take SIGTERM back at once.

Never import it anywhere else: the process that does stops answering Ctrl-C and SIGTERM.
"""

import os
import signal

for _name in [name for name in os.environ if name.startswith("JAX_")]:
    del os.environ[_name]
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
