"""jaxdist.agents.actor_critic: torsos by name, the actor-critic for discrete and continuous actions
on vectors and images, custom networks, and Ape-X's dueling Q-network."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pixel_envs
from jaxdist.agents import actor_critic
from jaxdist.agents.actor_critic import ActorCritic, torso
from jaxdist.agents.apex.learning import QNetwork
from jaxdist.envs.spaces import ActionSpace

DISCRETE = ActionSpace(num_actions=3)
BOX = ActionSpace(shape=(2,), low=(-1.0, -1.0), high=(1.0, 1.0))
FRAME = (36, 36, 1)

VARIANTS = {  # name: (action space, network, observation shape, observation dtype)
    "discrete_mlp": (DISCRETE, "mlp", (4,), np.float32),
    "continuous_mlp": (BOX, "mlp", (4,), np.float32),
    "discrete_cnn": (DISCRETE, "cnn", FRAME, np.uint8),
    "continuous_cnn": (BOX, "cnn", FRAME, np.uint8),
    "discrete_minatar_cnn": (DISCRETE, "cnn", (10, 10, 4), np.float32),
    "custom_by_name": (DISCRETE, "pixel_envs:small_cnn", FRAME, np.uint8),
    "custom_callable": (BOX, pixel_envs.small_cnn, FRAME, np.uint8),
}


def observations(shape: tuple[int, ...], dtype: type, batch: tuple[int, ...], seed: int = 0) -> jax.Array:
    rng = np.random.default_rng(seed)
    if dtype == np.uint8:
        return jnp.asarray(rng.integers(0, 256, (*batch, *shape)), jnp.uint8)
    return jnp.asarray(rng.normal(size=(*batch, *shape)), jnp.float32)


def init(net: nn.Module, shape: tuple[int, ...], dtype: type) -> dict:
    return net.init(jax.random.key(0), observations(shape, dtype, (1,)))


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("batch", [(5,), (2, 3)])
def test_actor_critic_shapes_for_batch_dims_of_rank_1_and_2(name, batch):
    space, network, shape, dtype = VARIANTS[name]
    net = ActorCritic(space, network)
    params = init(net, shape, dtype)
    dist, value = jax.jit(net.apply)(params, observations(shape, dtype, batch))
    assert value.shape == batch and value.dtype == jnp.float32
    if space.discrete:
        assert dist.shape == (*batch, 3)
    else:
        mean, log_std = dist
        assert mean.shape == (*batch, 2) and log_std.shape == (2,)
    action = actor_critic.sample(space, dist, jax.random.key(1))
    assert actor_critic.log_prob(space, dist, action).shape == batch


@pytest.mark.parametrize("name", VARIANTS)
def test_policy_alone_equals_the_policy_part_of_the_full_call(name):
    space, network, shape, dtype = VARIANTS[name]
    net = ActorCritic(space, network)
    params = init(net, shape, dtype)
    obs = observations(shape, dtype, (4,), seed=1)
    full = net.apply(params, obs)[0]
    alone = net.apply(params, obs, method="policy")
    chex.assert_trees_all_equal(alone, full)


def test_mlp_has_separate_policy_and_value_torsos_and_cnn_shares_one():
    mlp = init(ActorCritic(DISCRETE), (4,), np.float32)["params"]
    cnn = init(ActorCritic(DISCRETE, "cnn"), FRAME, np.uint8)["params"]
    assert set(mlp) == {"torso", "value_torso", "head", "value_head"}
    assert set(cnn) == {"torso", "head", "value_head"}
    assert mlp["torso"]["Dense_1"]["kernel"].shape == (64, 64)


def test_log_std_is_a_state_independent_parameter_that_learns():
    net = ActorCritic(BOX, hidden=(8,))
    params = init(net, (4,), np.float32)
    np.testing.assert_array_equal(params["params"]["log_std"], np.zeros(2))
    obs = observations((4,), np.float32, (6,))

    def loss(p):
        return -actor_critic.log_prob(BOX, net.apply(p, obs, method="policy"), jnp.full((6, 2), 3.0)).sum()

    assert np.all(np.asarray(jax.grad(loss)(params)["params"]["log_std"]) != 0)


def test_heads_start_small_for_the_policy_and_unit_for_the_value():
    params = init(ActorCritic(DISCRETE, hidden=(64,)), (4,), np.float32)["params"]
    policy_kernel, value_kernel = params["head"]["kernel"], params["value_head"]["kernel"]
    # Orthogonal columns of norm gain: 0.01 for the policy logits, 1 for the value.
    np.testing.assert_allclose(np.linalg.norm(policy_kernel, axis=0), 0.01, rtol=1e-4)
    np.testing.assert_allclose(np.linalg.norm(value_kernel, axis=0), 1.0, rtol=1e-4)


def test_cnn_scales_uint8_frames_and_takes_unbatched_ones():
    net = ActorCritic(DISCRETE, "cnn")
    params = init(net, FRAME, np.uint8)
    frames = observations(FRAME, np.uint8, (2,))
    as_bytes = net.apply(params, frames)
    as_floats = net.apply(params, frames.astype(jnp.float32) / 255.0)
    chex.assert_trees_all_close(as_bytes, as_floats, rtol=1e-5, atol=1e-6)
    one = net.apply(params, frames[0])
    chex.assert_trees_all_close(one, jax.tree.map(lambda x: x[0], as_bytes), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make", [lambda channels_first: ActorCritic(DISCRETE, "cnn", channels_first=channels_first),
                                  lambda channels_first: QNetwork(3, "cnn", channels_first=channels_first)],
                         ids=["actor_critic", "q_network"])
def test_channels_first_frames_meet_the_same_network_as_channels_last_ones(make):
    """EnvPool's Atari frames come (frames, H, W): the network moves the channels last itself, so
    the same parameters see the same images whichever layout the env sends."""
    stacked = observations((36, 36, 4), np.uint8, (2, 3))
    last, first = make(False), make(True)
    params = init(last, (36, 36, 4), np.uint8)
    chex.assert_trees_all_equal_shapes(params, init(first, (4, 36, 36), np.uint8))
    chex.assert_trees_all_close(first.apply(params, np.moveaxis(stacked, -1, -3)), last.apply(params, stacked),
                                rtol=1e-6, atol=1e-6)


def test_nature_torso_has_the_papers_layers():
    params = torso("cnn", ()).init(jax.random.key(0), jnp.zeros((1, *FRAME)))["params"]
    kernels = [params[f"Conv_{i}"]["kernel"].shape for i in range(3)]
    assert kernels == [(8, 8, 1, 32), (4, 4, 32, 64), (3, 3, 64, 64)]
    assert params["Dense_0"]["kernel"].shape == (64, 512)  # 36 -> 8 -> 3 -> 1, 64 channels


def test_cnn_takes_grids_too_small_for_the_nature_torso_with_minatars_layers():
    """The Nature-DQN torso's VALID convolutions cannot take MinAtar's 10x10 grids."""
    params = torso("cnn", ()).init(jax.random.key(0), jnp.zeros((1, 10, 10, 4)))["params"]
    assert set(params) == {"Conv_0", "Dense_0"}
    assert params["Conv_0"]["kernel"].shape == (3, 3, 4, 16)
    assert params["Dense_0"]["kernel"].shape == (10 * 10 * 16, 128)  # SAME padding keeps the grid


def test_a_missing_network_module_is_named():
    with pytest.raises(ValueError, match=r"network 'no_such_pkg.nets:torso': cannot import module "
                                         r"'no_such_pkg.nets'.*PYTHONPATH"):
        torso("no_such_pkg.nets:torso", ())


def test_a_missing_network_function_is_named():
    with pytest.raises(ValueError, match=r"module 'pixel_envs' has no function 'nothing'"):
        torso("pixel_envs:nothing", ())


def test_a_network_that_is_not_a_flax_module_is_refused():
    with pytest.raises(TypeError, match=r"returned PixelChase, not a flax nn.Module"):
        torso("pixel_envs:PixelChase", ())
    with pytest.raises(TypeError, match=r"returned list, not a flax nn.Module"):
        torso(lambda: [nn.Dense(3)], ())


def test_an_unknown_network_name_lists_the_choices():
    with pytest.raises(ValueError, match=r"'mlp', 'cnn' or 'package.module:function'; got 'resnet'"):
        torso("resnet", ())


@pytest.mark.parametrize("network,shape,dtype", [("mlp", (4,), np.float32), ("cnn", FRAME, np.uint8)])
def test_dueling_q_values_are_value_plus_centred_advantage(network, shape, dtype):
    net = QNetwork(3, network)
    params = init(net, shape, dtype)
    q, inter = net.apply(params, observations(shape, dtype, (2, 5)), capture_intermediates=True,
                         mutable=["intermediates"])
    advantage = inter["intermediates"]["Dense_0"]["__call__"][0]
    value = inter["intermediates"]["Dense_1"]["__call__"][0]
    assert q.shape == (2, 5, 3) and value.shape == (2, 5, 1)
    np.testing.assert_allclose(q, value + advantage - advantage.mean(-1, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(q.mean(-1), value[..., 0], rtol=1e-5, atol=1e-5)


def test_q_network_keeps_apex_relu_mlp_and_plain_head():
    net = QNetwork(4, hidden=(32, 16), dueling=False)
    params = init(net, (6,), np.float32)
    q, inter = net.apply(params, observations((6,), np.float32, (50,)), capture_intermediates=True,
                         mutable=["intermediates"])
    features = inter["intermediates"]["MLP_0"]["__call__"][0]
    assert q.shape == (50, 4) and features.shape == (50, 16)
    assert features.min() == 0.0  # ReLU
    assert set(params["params"]) == {"MLP_0", "Dense_0"}
