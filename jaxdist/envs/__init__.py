"""Environments as actors, the evaluator and Anakin play them: gymnasium's vector envs with the
autoreset row made explicit (``vector``), their action and observation spaces (``spaces``), the
JAX ports of a few envs (``jax_envs``, which ids have one: ``ports``), the one JAX rollout
that plays them (``jax_rollout``), and partially observable tasks (``masked``: importing this
package registers ``CartPoleNoVel-v1`` and ``PendulumNoVel-v1`` with gymnasium)."""

from jaxdist.envs.masked import register_no_velocity

register_no_velocity()
