"""Play a trained policy: ``python -m jaxdist.tools.evaluate RUN_DIR --episodes N [--video DIR]``.

Loads the run's config and latest learner checkpoint, or ``--step``'s, and of a run of several
seeds ``--run-seed``'s policy (``jaxdist.agents.load_policy``), plays ``episodes`` episodes of
its env one after another on fresh seeds, made as the run's evaluator makes it (an Atari game's
whole games and sticky actions included), prints each return and the mean, and with ``--video``
records them with gymnasium's vector ``RecordVideo`` where the env renders (``pip install
'jaxdist[video]'``). A run directory, step or seed with no policy is an error line, not a
traceback.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Annotated

import numpy as np
import tyro

if TYPE_CHECKING:
    from jaxdist.agents.trained import TrainedPolicy
    from jaxdist.envs.vector import VectorEnv


@dataclasses.dataclass(frozen=True)
class Arguments:
    run_dir: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR")]
    """A run directory, e.g. runs/ppo-cartpole-seed0."""
    episodes: int = 10
    step: int | None = None
    """Play the checkpoint of this learner update (ES: generation; default: the latest)."""
    run_seed: int = 0
    """Of a run that trained several seeds at once (--num-seeds), this seed's policy."""
    best: bool = False
    """Play the policy of the run's best evaluation (under Anakin, the seed's) instead of the latest checkpoint's."""
    video: str | None = None
    """Write one MP4 per episode into this directory (the env must render rgb_array frames)."""
    seed: int = 1_000_000
    """Episode i is seeded seed + i (away from the actors' and the evaluator's seeds); EnvPool's
    Atari games are seeded once, with seed, where EnvPool makes its envs: later episodes draw on from there."""
    trust_run_dir: bool = False
    """Import modules config.json names even where their code lies inside the run directory."""
    stochastic: bool = False
    """Sample (or explore) as the actors did instead of acting deterministically."""
    max_episode_steps: int | None = None
    """End an episode after this many steps (default: where the env ends it)."""


def load(arguments: Arguments) -> TrainedPolicy:
    """The policy to play; ValueError or FileNotFoundError where the arguments name none."""
    from jaxdist.agents import load_policy

    if arguments.episodes < 1:
        raise ValueError(f"--episodes must be at least 1, got {arguments.episodes}")
    if arguments.max_episode_steps is not None and arguments.max_episode_steps < 1:
        raise ValueError(f"--max-episode-steps must be at least 1, got {arguments.max_episode_steps}")
    if arguments.best and arguments.step is not None:
        raise ValueError("--best and --step name two policies: pass one")
    return load_policy(arguments.run_dir, step=arguments.step, run_seed=arguments.run_seed, best=arguments.best,
                       trust_run_dir=arguments.trust_run_dir)


def make_env(policy: TrainedPolicy, arguments: Arguments) -> VectorEnv:
    """One env of the run's evaluator (``env_spec(..., evaluation=True)``: an Atari game's whole
    games, its sticky actions), on gymnasium's env where the run played a JAX port, recording
    each episode with ``--video``."""
    import gymnasium as gym

    from jaxdist.agents.experiment import AgentConfig, env_spec
    from jaxdist.envs.vector import EnvSpec

    config = policy.config
    # ES evaluates JAX ports of gymnasium's envs only; a port is checked step for step against
    # gymnasium's env, which plays it here.
    spec = env_spec(config, 1, evaluation=True) if isinstance(config, AgentConfig) else EnvSpec(config.env_id, 1)
    if spec.backend == "jax":
        spec = dataclasses.replace(spec, backend="auto")
    if not arguments.video:
        return spec.make(arguments.seed)
    record = functools.partial(gym.wrappers.vector.RecordVideo, video_folder=arguments.video,
                               episode_trigger=lambda episode: True, disable_logger=True,
                               name_prefix=f"{policy.agent.name}-update{policy.step}")
    try:
        return dataclasses.replace(spec, kwargs={**spec.kwargs, "render_mode": "rgb_array"}).make(arguments.seed,
                                                                                                  wrap=record)
    except TypeError as error:  # an env of one's own without a render_mode
        raise SystemExit(f"error: --video records the frames an env renders, and {policy.env_id} takes no "
                         f"render_mode ({error}): give its constructor render_mode='rgb_array' and a "
                         f"render()") from None


def play(policy: TrainedPolicy, arguments: Arguments) -> list[float]:
    """The episodes' returns (also printed)."""
    import gymnasium as gym

    env = make_env(policy, arguments)
    returns = []
    try:
        for episode in range(arguments.episodes):
            env.seed = arguments.seed + episode  # EnvPool's games were seeded where they were made
            try:
                timestep = env.reset()
            except gym.error.DependencyNotInstalled as error:  # the env's renderer, asked for by --video
                raise SystemExit(f"recording {policy.env_id} needs its renderer: {error} (pip install "
                                 f"'jaxdist[video]' installs moviepy and pygame)") from None
            total, steps = 0.0, 0
            state = policy.initial_state(1) if policy.recurrent else None  # a recurrent policy's memory
            while not (timestep.terminated[0] or timestep.truncated[0]) and steps != arguments.max_episode_steps:
                if state is None:
                    action = policy.act(timestep.obs, deterministic=not arguments.stochastic)
                else:
                    action, state = policy.act(timestep.obs, deterministic=not arguments.stochastic, state=state,
                                               first=timestep.first)
                timestep = env.step(action)
                total, steps = total + float(timestep.reward[0]), steps + 1
            returns.append(total)
            cut = "" if timestep.terminated[0] or timestep.truncated[0] else f" (cut at {steps} steps)"
            print(f"episode {episode}: return {total:.1f}{cut}", flush=True)
    finally:
        env.close()
    print(f"{policy.agent.name} on {policy.env_id} at update {policy.step}: mean return {np.mean(returns):.1f} "
          f"over {len(returns)} episodes (min {np.min(returns):.1f}, max {np.max(returns):.1f})")
    if arguments.video:
        print(f"videos in {arguments.video}")
    return returns


def main() -> None:
    arguments = tyro.cli(Arguments, prog="python -m jaxdist.tools.evaluate", description=__doc__)
    try:
        policy = load(arguments)
    except (ValueError, FileNotFoundError, PermissionError) as error:  # the message says what to pass instead
        raise SystemExit(f"error: {error}") from None
    play(policy, arguments)


if __name__ == "__main__":
    main()
