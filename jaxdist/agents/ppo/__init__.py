"""PPO: ``learning.py`` (the math), ``networks.py``, ``config.py`` (``PPOConfig``),
``builder.py`` (``make_program``), ``training.py`` (``train``: launch, watch, summarise)."""

from jaxdist.agents.ppo.builder import make_program
from jaxdist.agents.ppo.config import PPOConfig
from jaxdist.agents.ppo.training import train

__all__ = ["PPOConfig", "make_program", "train"]
