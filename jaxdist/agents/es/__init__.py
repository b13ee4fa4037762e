"""OpenAI-ES: ``learning.py`` (the math: seeded noise, centered ranks, the antithetic gradient
estimate, the optax step), ``dynamics.py`` (CartPole-v1 and Pendulum-v1 in JAX), ``policy.py``
(an MLP over a flat parameter vector), ``rollout.py`` (jitted episode batches), ``gym_eval.py``
(returns on gymnasium's own envs), ``search.py`` (the JAX side of the nodes), ``evaluator.py``
and ``master.py`` (the nodes), ``config.py`` (``ESConfig``), ``builder.py`` (``make_program``),
``training.py`` (``train``). Importing this package imports no JAX."""

from jaxdist.agents.es.builder import make_program
from jaxdist.agents.es.config import ESConfig
from jaxdist.agents.es.training import train

__all__ = ["ESConfig", "make_program", "train"]
