"""Agents: one package per algorithm (``ppo``, ``impala``, ``apex``, ``r2d2``, ``es``), each a
record (its config, presets and ``agent()``, naming its parts as ``module:function``; no JAX) in
``__init__.py`` and its math in ``learning.py``. Shared by them: the experiment (the config base,
the agent record, the topologies: ``experiment.py``), the run (command line, monitor, report:
``run.py``), the actor-critic kit (``actor_critic.py``), the recurrent cores (``recurrent.py``),
and ``load_policy`` (``trained.py``) to act with a trained policy. An agent of one's own is the
same three files outside this package."""

from jaxdist.agents.trained import load_policy

__all__ = ["load_policy"]
