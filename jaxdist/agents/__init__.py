"""Agents: one package per algorithm, each with its math in one module and a
``make_program(config)`` that wires actors, replay and the generic learner."""
