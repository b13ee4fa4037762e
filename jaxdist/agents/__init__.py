"""Agents: one package per algorithm, each with its math in one module and a
``make_program(config)`` that wires actors, replay and the generic learner. Shared by them:
``networks.py`` (the actor-critic), ``common.py`` (the FIFO learner, seeds, resources),
``training.py`` (the monitor and ``run``) and ``cli.py`` (flags, run directories, reports)."""
