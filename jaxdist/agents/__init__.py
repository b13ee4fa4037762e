"""Agents: one package per algorithm (``ppo``, ``impala``, ``apex``, ``es``), each with its math in
one ``learning.py`` and its config in ``config.py``, built on one actor-learner topology
(``distributed.py``). Shared by them: the config base and presets (``config.py``), the command
line (``cli.py``), the watcher (``monitor.py``), the evaluator node, networks, distributions,
normalisation, policies, and ``load_policy`` (``trained.py``) to act with a trained policy."""

from jaxdist.agents.trained import load_policy

__all__ = ["load_policy"]
