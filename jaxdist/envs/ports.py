"""Which envs have a JAX version here, without importing JAX: a config refuses an env that has
none (``--env-backend jax``, ``--architecture anakin``) before anything is launched."""

from __future__ import annotations

import importlib.util

from jaxdist.envs.masked import MASKED

JAX_PORTS = ("CartPole-v1", "Pendulum-v1")
"""The ids ``jaxdist.envs.jax_envs`` ports itself, checked step for step against gymnasium's envs."""

GYMNAX_IDS = ("Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0", "Breakout-MinAtar",
              "SpaceInvaders-MinAtar", "Asterix-MinAtar", "Freeway-MinAtar")
"""gymnax's envs that gymnasium also knows by the same id (the agents read an env's spaces from
gymnasium's; the MinAtar games are registered by ``jaxdist.envs.gymnax_as_gym``): with
``jaxdist[jaxenv]`` these have a JAX version too."""


def gymnax_installed() -> bool:
    return importlib.util.find_spec("gymnax") is not None


def envpool_installed() -> bool:
    return importlib.util.find_spec("envpool") is not None


def jax_version_missing(env_id: str) -> str | None:
    """Why the agents have no JAX version of ``env_id`` (a registered id, or a task masked with
    :func:`jaxdist.envs.masked.register_masked`) here, naming the ids
    that have one and what to install; None when it has one. Imports no JAX, so that a config
    refuses such an id before anything is launched."""
    if env_id in MASKED:  # a masked task has the JAX version of its base, masked
        return jax_version_missing(MASKED[env_id][0])
    if env_id in JAX_PORTS or (env_id in GYMNAX_IDS and gymnax_installed()):
        return None
    install = "" if gymnax_installed() else " with pip install -e '.[jaxenv]' in the jaxdist clone"
    return (f"no JAX version of {env_id!r}: jaxdist.envs.jax_envs ports {', '.join(JAX_PORTS)}; gymnax's "
            f"{', '.join(GYMNAX_IDS)}{install}")
