"""OpenAI-ES: ``learning.py`` (the math: seeded noise, centered ranks, the antithetic gradient
estimate, the optax step), ``policy.py`` (an MLP over a flat parameter vector), ``rollout.py``
(jitted episode batches on the JAX envs of ``jaxdist.jax_envs``), ``gym_eval.py``
(returns on gymnasium's own envs), ``search.py`` (the JAX side of the nodes), ``evaluator.py``
and ``master.py`` (the nodes), ``config.py`` (``ESConfig`` and per-env ``PRESETS``),
``builder.py`` (``make_program``), ``training.py`` (``train``). ES keeps its own program (a
master mapping seeds over evaluators through ``jd.Pool``) and shares the agents' command line
and report (``jaxdist.agents.cli``). Importing this package imports no JAX."""

from jaxdist.agents.es.builder import make_program
from jaxdist.agents.es.config import PRESETS, ESConfig
from jaxdist.agents.es.training import train

__all__ = ["ESConfig", "PRESETS", "make_program", "train"]
