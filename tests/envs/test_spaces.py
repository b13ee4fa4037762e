"""jaxdist.envs.spaces: action-space records from gymnasium spaces, env_info, and the pixel
test env (tests/support/pixel_envs.py)."""

import logging
import subprocess
import sys
import warnings

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import pixel_envs
from jaxdist.envs.spaces import ActionSpace, EnvInfo, env_info


def test_discrete_space_records_its_number_of_actions():
    space = ActionSpace.from_gym(gymnasium.spaces.Discrete(5))
    assert space == ActionSpace(num_actions=5)
    assert space.discrete and space.size == 5


def test_box_space_keeps_shape_and_flattened_bounds_including_infinite_ones():
    box = gymnasium.spaces.Box(np.array([[-1.0, -np.inf]], np.float32),
                               np.array([[2.0, np.inf]], np.float32))
    space = ActionSpace.from_gym(box)
    assert space == ActionSpace(shape=(1, 2), low=(-1.0, -np.inf), high=(2.0, np.inf))
    assert not space.discrete and space.size == 2


def test_action_spaces_are_hashable_for_static_arguments():
    a = ActionSpace.from_gym(gymnasium.spaces.Box(-1.0, 1.0, (3,)))
    b = ActionSpace(shape=(3,), low=(-1.0,) * 3, high=(1.0,) * 3)
    assert hash(a) == hash(b) and {a: 1}[b] == 1


def test_discrete_space_with_nonzero_start_is_refused_with_a_fix():
    with pytest.raises(ValueError, match="starts at 1.*TransformAction"):
        ActionSpace.from_gym(gymnasium.spaces.Discrete(3, start=1))


@pytest.mark.parametrize("space", [
    gymnasium.spaces.MultiDiscrete([2, 3]),
    gymnasium.spaces.MultiBinary(4),
    gymnasium.spaces.Dict({"a": gymnasium.spaces.Discrete(2)}),
    gymnasium.spaces.Tuple([gymnasium.spaces.Discrete(2)]),
    gymnasium.spaces.Box(0, 3, (2,), dtype=np.int64),
])
def test_unsupported_spaces_are_named_with_the_supported_ones(space):
    with pytest.raises(ValueError, match=r"is not supported; supported: Discrete .*Box") as err:
        ActionSpace.from_gym(space)
    assert str(space) in str(err.value)


def test_inconsistent_records_are_refused():
    with pytest.raises(ValueError, match="continuous ActionSpace needs"):
        ActionSpace(shape=(2,), low=(-1.0,), high=(1.0,))
    with pytest.raises(ValueError, match="discrete ActionSpace"):
        ActionSpace(num_actions=0)


def test_env_info_of_registered_envs():
    assert env_info("CartPole-v1") == EnvInfo((4,), "float32", ActionSpace(num_actions=2))
    pendulum = env_info("Pendulum-v1")
    assert pendulum == EnvInfo((3,), "float32", ActionSpace(shape=(1,), low=(-2.0,), high=(2.0,)))
    assert env_info("Pendulum-v1") is pendulum  # cached


def test_env_info_imports_the_module_of_a_module_env_id():
    info = env_info("pixel_envs:PixelChase-v0")
    assert info == EnvInfo((36, 36, 1), "uint8", ActionSpace(num_actions=2))


def test_unknown_env_id_says_how_to_register_and_keeps_gymnasiums_text():
    with pytest.raises(ValueError, match=r"unknown environment id 'NoSuchEnv-v0': Environment "
                                         r"`NoSuchEnv` doesn't exist.*module:EnvId"):
        env_info("NoSuchEnv-v0")


def _needs_a_simulator() -> gymnasium.Env:
    raise gymnasium.error.DependencyNotInstalled('Sim is not installed, run `pip install "gymnasium[sim]"`')


def test_an_env_whose_dependency_is_missing_says_what_to_install():
    """Before, gymnasium's DependencyNotInstalled (CarRacing without Box2D) came out of the
    agent scripts as a traceback."""
    gymnasium.register("NeedsASimulator-v0", entry_point=_needs_a_simulator)
    with pytest.raises(ValueError, match=r"environment 'NeedsASimulator-v0' needs what is not installed here: "
                                         r"Sim is not installed, run `pip install \"gymnasium\[sim\]\"`"):
        env_info("NeedsASimulator-v0")


def test_missing_module_of_a_module_env_id_is_named():
    with pytest.raises(ValueError, match=r"cannot import module 'no_such_module'.*PYTHONPATH"):
        env_info("no_such_module:Thing-v0")


def test_env_info_does_not_import_jax():
    code = "import sys; from jaxdist.envs import spaces; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_pixel_chase_passes_gymnasiums_env_checker():
    env = gymnasium.make("pixel_envs:PixelChase-v0").unwrapped
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env, skip_render_check=True)


def test_pixel_chase_is_deterministic_under_a_seed_and_shows_the_rewarded_side():
    def play(seed: int) -> tuple[list[np.ndarray], list[float]]:
        env = pixel_envs.PixelChase()
        obs, _ = env.reset(seed=seed)
        frames, rewards = [obs], []
        for _ in range(16):
            side = int(obs[..., 0].max(axis=0).argmax() >= 18)  # column of the block
            obs, reward, terminated, truncated, _ = env.step(side)
            frames.append(obs)
            rewards.append(reward)
        return frames, rewards

    frames, rewards = play(3)
    again, _ = play(3)
    other, _ = play(4)
    assert all(np.array_equal(a, b) for a, b in zip(frames, again))
    assert not all(np.array_equal(a, b) for a, b in zip(frames, other))
    assert rewards == [1.0] * 16
    assert all(f.dtype == np.uint8 and f.shape == (36, 36, 1) and (f == 255).sum() == 16 for f in frames)


def test_pixel_chase_truncates_itself_after_its_episode_steps():
    env = gymnasium.make("pixel_envs:PixelChase-v0")
    env.reset(seed=0)
    ends = [env.step(0)[2:4] for _ in range(16)]
    assert ends == [(False, False)] * 15 + [(False, True)]


def test_pixel_chase_pays_a_constant_guess_about_half_the_time():
    env = pixel_envs.PixelChase()
    env.reset(seed=0)
    assert 0.45 < np.mean([env.step(0)[1] for _ in range(2000)]) < 0.55


def test_mujocos_warnings_go_to_logging_not_to_a_file_in_the_working_directory(tmp_path, monkeypatch, caplog):
    pytest.importorskip("mujoco", reason="MuJoCo envs need the mujoco extra")
    monkeypatch.chdir(tmp_path)
    env_info.cache_clear()
    with caplog.at_level(logging.DEBUG, logger="jaxdist.envs.mujoco_log"):
        env_info("HalfCheetah-v5")  # gymnasium's model file uses a compiler attribute MuJoCo deprecates
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()
    assert any("deprecated" in record.getMessage() and record.levelno == logging.DEBUG for record in caplog.records)
