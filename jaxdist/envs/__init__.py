"""Environments as actors, the evaluator and Anakin play them: gymnasium's vector envs with the
autoreset row made explicit (``vector``), their action and observation spaces (``spaces``), the
JAX ports of a few envs (``jax_envs``, which ids have one: ``ports``) and the one JAX rollout
that plays them (``jax_rollout``)."""
