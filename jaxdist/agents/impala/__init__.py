"""IMPALA with V-trace (Espeholt et al., 2018): ``vtrace.py`` (the off-policy correction, a pure
function), ``learning.py`` (the loss and the jitted update; the network is PPO's flax
actor-critic, in ``jaxdist.agents.networks``), ``acting.py`` (the actors' policy step, which sends the behaviour logits),
``config.py`` (``IMPALAConfig``), ``builder.py`` (``make_program``: asynchronous actors, FIFO
replay and the generic learner), ``training.py`` (``train``: launch under the shared monitor of
``jaxdist.agents.training``)."""

from jaxdist.agents.impala.builder import make_program
from jaxdist.agents.impala.config import IMPALAConfig
from jaxdist.agents.impala.training import train

__all__ = ["IMPALAConfig", "make_program", "train"]
