"""Atari through EnvPool (its C++ ALE, stepped on threads of its own): the ids EnvPool knows
(``Pong-v5``, ``Breakout-v5``, ...), their standard preprocessing, and observations as EnvPool
makes them, channels-first, ``(4, 84, 84)`` uint8: the stacked frames first. The agents' CNN
moves the channels last inside its jitted call (``EnvInfo.channels_first`` tells it to). Moved on
the actor instead, every step's frames became a strided view that the actor's core then copied
twice (into the trajectory, onto the wire): about 15% of EnvPool's own CPU time there.

EnvPool's preprocessing (Machado et al. 2018's protocol as Cleanba and CleanRL train): 84x84
grayscale frames, 4 stacked, a frame skip of 4 (an env step is 4 frames: ``FRAME_SKIP``), up to
30 no-ops at reset, fire at reset, 27,000-step (108k-frame) games. Actors train with
``TRAINING`` on top (a lost life ends an episode, rewards clipped to their sign); the evaluator
plays ``EVALUATION``'s whole games with the game's own scores.

A whole game is played as Cleanba, CleanRL and Baselines score theirs: EnvPool begins each life
as in training (its ``episodic_life`` reset: no-ops, then FIRE where the game has it), and the
episode ends at game over, not at a lost life. Trained on lives that EnvPool always starts, a
policy never learns to press FIRE itself; a game whose lives began without FIRE (Breakout's ball
is served by it) would sit until the 27,000-step cap.

Sticky actions are an option (a config's ``repeat_action_probability``, given to EnvPool as
its own ``repeat_action_probability`` for actors and evaluator alike): off by default, as
EnvPool's ``-v5`` ids are (its default is 0), since the IMPALA and Ape-X papers and Cleanba,
whose settings the presets take, trained and scored without them; Machado et al. 2018's
protocol uses 0.25, the default of gymnasium's own ``ALE/...-v5`` ids, so compare a score with
the literature's at the probability it was measured at.

Nothing here imports EnvPool until an id has to be looked up in its registry (it takes seconds).
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium
import numpy as np

from jaxdist.envs.ports import envpool_installed

FRAME_SKIP = 4
"""Frames per env step: the literature counts frames, the agents count env steps."""

TRAINING = {"episodic_life": True, "reward_clip": True}
EVALUATION = {"whole_games": True, "reward_clip": False}
"""``whole_games`` is this module's (``make``): lives begun as in training, episodes that end at
game over."""


def is_atari(env_id: str) -> bool:
    """Whether ``env_id`` is one of EnvPool's Atari games (False where EnvPool is missing)."""
    if ":" in env_id or not env_id.endswith("-v5") or not envpool_installed():
        return False
    return env_id in _atari_ids()


@functools.lru_cache(maxsize=1)
def _atari_ids() -> frozenset[str]:
    from envpool.registration import registry

    return frozenset(env_id for env_id, (module, *_) in registry.specs.items() if module == "envpool.atari")


def spaces(env_id: str) -> tuple[Any, Any]:
    """(observation space, action space) of one env of the game, channels-first."""
    import envpool

    spec = envpool.make_spec(env_id)
    obs, action = spec.observation_space, spec.action_space
    return gymnasium.spaces.Box(0, 255, tuple(obs.shape), np.uint8), gymnasium.spaces.Discrete(int(action.n))


def make(env_id: str, num_envs: int, *, whole_games: bool = False, **kwargs: Any) -> Games:
    """EnvPool's vector env of the game: ``TRAINING``'s preprocessing unless ``kwargs`` (EnvPool's
    options, its ``seed`` among them) say otherwise; with ``whole_games``, episodes end at game
    over (the module docstring)."""
    import envpool

    options = {**TRAINING, **kwargs}
    if whole_games:
        options["episodic_life"] = True  # each life begun by EnvPool's reset, as in training
    return Games(envpool.make_gymnasium(env_id, num_envs=num_envs, **options), env_id, whole_games)


class Games(gymnasium.vector.VectorWrapper):
    """An EnvPool Atari vector env with gymnasium's spaces; with ``whole_games``, a lost life is
    no termination (EnvPool's next step begins the next life, while its ``reset()`` begins new
    games). Made with ``render_mode="rgb_array"``, it renders each env's screen, as gymnasium's
    vector ``RecordVideo`` records them."""

    def __init__(self, env: Any, env_id: str, whole_games: bool = False) -> None:
        super().__init__(env)
        self._whole_games = whole_games
        self.single_observation_space, self.single_action_space = spaces(env_id)
        self.observation_space = gymnasium.vector.utils.batch_space(self.single_observation_space, self.num_envs)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, Any, Any, Any, dict]:
        obs, reward, terminated, truncated, info = self.env.step(actions)
        if self._whole_games:
            terminated = terminated & info["terminated"].astype(bool)  # EnvPool's: the game is over
        return obs, reward, terminated, truncated, info

    def render(self) -> list[np.ndarray] | None:
        frames = self.env.render()
        return None if frames is None else list(frames)
