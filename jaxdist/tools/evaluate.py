"""Play a trained policy: ``python -m jaxdist.tools.evaluate RUN_DIR --episodes N [--video DIR]``.

Loads the run's config and latest learner checkpoint, or ``--step``'s, and of a run of several
seeds ``--run-seed``'s policy (``jaxdist.agents.load_policy``), plays ``episodes`` episodes of
its env one after another on fresh seeds, prints each return and the mean, and with ``--video``
records them with gymnasium's ``RecordVideo`` where the env renders (``pip install
'jaxdist[video]'``). A run directory, step or seed with no policy is an error line, not a
traceback.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Annotated

import numpy as np
import tyro

if TYPE_CHECKING:
    from jaxdist.agents.trained import TrainedPolicy


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
    """Episode i is seeded seed + i (away from the actors' and the evaluator's seeds)."""
    trust_run_dir: bool = False
    """Import modules config.json names even where their code lies inside the run directory."""
    stochastic: bool = False
    """Sample (or explore) as the actors did instead of acting deterministically."""


def load(arguments: Arguments) -> TrainedPolicy:
    """The policy to play; ValueError or FileNotFoundError where the arguments name none."""
    from jaxdist.agents import load_policy

    if arguments.episodes < 1:
        raise ValueError(f"--episodes must be at least 1, got {arguments.episodes}")
    if arguments.best and arguments.step is not None:
        raise ValueError("--best and --step name two policies: pass one")
    return load_policy(arguments.run_dir, step=arguments.step, run_seed=arguments.run_seed, best=arguments.best,
                       trust_run_dir=arguments.trust_run_dir)


def play(policy: TrainedPolicy, arguments: Arguments) -> list[float]:
    """The episodes' returns (also printed)."""
    import gymnasium as gym

    from jaxdist.envs.mujoco_log import route_mujoco_warnings
    from jaxdist.envs.vector import registered_id

    # render_mode only when recording: an env of one's own need not take it.
    try:
        route_mujoco_warnings(gym.spec(registered_id(policy.env_id)).entry_point)
        env = gym.make(policy.env_id, **({"render_mode": "rgb_array"} if arguments.video else {}))
    except TypeError as error:
        if not arguments.video:
            raise
        raise SystemExit(f"error: --video records the frames an env renders, and {policy.env_id} takes no "
                         f"render_mode ({error}): give its constructor render_mode='rgb_array' and a "
                         f"render()") from None
    if arguments.video:
        env = gym.wrappers.RecordVideo(env, arguments.video, episode_trigger=lambda episode: True,
                                       name_prefix=f"{policy.agent.name}-update{policy.step}", disable_logger=True)
    if isinstance(env.action_space, gym.spaces.Box):
        env = gym.wrappers.ClipAction(env)
    returns = []
    try:
        for episode in range(arguments.episodes):
            try:
                obs, _ = env.reset(seed=arguments.seed + episode)
            except gym.error.DependencyNotInstalled as error:  # the env's renderer, asked for by --video
                raise SystemExit(f"recording {policy.env_id} needs its renderer: {error} (pip install "
                                 f"'jaxdist[video]' installs moviepy and pygame)") from None
            total, done = 0.0, False
            state = policy.initial_state(1) if policy.recurrent else None  # a recurrent policy's memory
            while not done:
                if state is None:
                    action = policy.act(obs[None], deterministic=not arguments.stochastic)[0]
                else:
                    actions, state = policy.act(obs[None], deterministic=not arguments.stochastic, state=state)
                    action = actions[0]
                obs, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
            print(f"episode {episode}: return {total:.1f}", flush=True)
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
