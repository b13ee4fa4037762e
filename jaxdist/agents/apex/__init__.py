"""Ape-X DQN (Horgan et al. 2018): ``learning.py`` (the math: n-step returns, initial priorities,
double-DQN targets, the importance-weighted loss, the jitted update), ``networks.py`` (a dueling
Q-network), ``acting.py`` (the epsilon schedule, the epsilon-greedy policy step, the sink that
inserts n-step transitions with priorities), ``config.py`` (``ApexConfig``), ``builder.py``
(``make_program``: actors, the prioritized replay and the generic learner, which writes
priorities back), ``training.py`` (``train``: launch under the shared monitor)."""

from jaxdist.agents.apex.builder import make_program
from jaxdist.agents.apex.config import ApexConfig
from jaxdist.agents.apex.training import train

__all__ = ["ApexConfig", "make_program", "train"]
