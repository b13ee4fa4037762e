"""PPO: ``learning.py`` (the math: GAE, the clipped loss, the jitted update), the flax
actor-critic in ``jaxdist.agents.networks``, ``acting.py`` (the actors' policy step), ``config.py`` (``PPOConfig``),
``builder.py`` (``make_program``: actors, FIFO replay and the generic learner), ``training.py``
(``train``: launch under the shared monitor of ``jaxdist.agents.training``)."""

from jaxdist.agents.ppo.builder import make_program
from jaxdist.agents.ppo.config import PPOConfig
from jaxdist.agents.ppo.training import train

__all__ = ["PPOConfig", "make_program", "train"]
