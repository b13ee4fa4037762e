"""The fields every actor-learner agent's config shares, and the checks and presets around them.

An agent's config is one frozen dataclass that extends :class:`AgentConfig` with its algorithm's
fields. It is the whole experiment: the command line is generated from it (``jaxdist.agents.
cli``), it is saved in the run directory, and ``load_policy`` rebuilds the policy from it.
Nothing here imports JAX: the launching process builds configs and programs without it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Callable, Mapping
from typing import Any, Literal

from jaxdist.envs.ports import jax_version_missing
from jaxdist.envs.vector import backend_unavailable

CONFIG_FILE = "config.json"


@dataclasses.dataclass(frozen=True)
class Bound:
    """The values a numeric field admits, written as its error message states them."""

    low: float
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False

    def admits(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below  # NaN admits neither

    def __str__(self) -> str:
        if self.high == math.inf:
            return f"{'>' if self.low_open else '>='} {_number(self.low)}"
        return (f"in {'(' if self.low_open else '['}{_number(self.low)}, {_number(self.high)}"
                f"{')' if self.high_open else ']'}")


AT_LEAST_ONE = Bound(1)
NON_NEGATIVE = Bound(0)
POSITIVE = Bound(0, low_open=True)
UNIT_INTERVAL = Bound(0, 1)
SEED = Bound(0, 2**32 - 1)


def check_bounds(config: Any, bounds: Mapping[str, Bound]) -> None:
    """Refuse the first field outside its bound, by name: a hyperparameter out of range trains
    nonsense or crashes nodes over and over, so it is refused before anything starts. A field
    that is None keeps its own meaning (a default); a tuple's every element is checked."""
    for name, bound in bounds.items():
        value = getattr(config, name)
        values = () if value is None else value if isinstance(value, tuple) else (value,)
        if not all(bound.admits(element) for element in values):
            each = " each" if isinstance(value, tuple) else ""
            raise ValueError(f"{name} must be {bound}{each}, got {value!r}")


CNN_MIN_SIZE = 36  # the Nature-DQN torso's VALID convolutions take 36 -> 8 -> 3 -> 1 pixels
_FACTORY = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


def check_network_name(network: Any) -> None:
    """``network`` is ``mlp``, ``cnn`` or ``package.module:function`` (from Python, also a
    callable); whether the function exists is known only where it is imported."""
    if isinstance(network, str) and network not in ("mlp", "cnn") and not _FACTORY.fullmatch(network):
        raise ValueError(f"network must be 'mlp', 'cnn' or 'package.module:function'; got {network!r}")


def check_network_input(network: Any, env_id: str, obs_shape: tuple[int, ...]) -> None:
    """Refuse the Nature-DQN torso for observations it cannot take, before a learner fails on them."""
    if network == "cnn" and (len(obs_shape) != 3 or min(obs_shape[:2]) < CNN_MIN_SIZE):
        raise ValueError(f"network 'cnn' (the Nature-DQN torso) takes images (height, width, channels) of at least "
                         f"{CNN_MIN_SIZE} pixels a side; {env_id}'s observations are {obs_shape}: use --network mlp "
                         f"or a torso of your own")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """What every agent shares: the environment and its actors, the network, evaluation, and
    the system (learner hosts, checkpoints, the actor-learner plumbing)."""

    # Environment and actors.
    env_id: str = "CartPole-v1"
    """A registered gymnasium id, or ``module:EnvId`` (gymnasium imports the module first)."""
    env_backend: Literal["auto", "vector", "sync", "async", "envpool", "jax"] = "auto"
    """How each actor vectorises its envs (see jaxdist.envs.vector); jax: the env's JAX version (jaxdist.envs.jax_envs;
    gymnax's with jaxdist[jaxenv]), a whole trajectory of policy and envs per jitted call."""
    num_actors: int = 2
    envs_per_actor: int = 8
    trajectory_length: int = 32
    """Env steps per trajectory an actor sends."""
    total_steps: int = 500_000
    """Env steps the learner learns from: sets its number of updates; training then ends."""
    seed: int = 0

    # Network.
    network: str = "mlp"
    """``mlp`` (widths in --hidden), ``cnn`` (the Nature-DQN torso, for image observations) or
    ``package.module:function`` returning a flax module (observations -> features)."""
    hidden: tuple[int, ...] = (64, 64)

    # Evaluation: the reported return and the target metric.
    eval_every_updates: int = 10
    """Learner updates between evaluations of the deterministic policy."""
    eval_episodes: int = 10
    """Episodes per evaluation, each on a fresh env seed."""
    target_return: float | None = None
    """The evaluation return whose first crossing is timed (None: the env's preset, if any)."""
    stop_at_target: bool = False
    """End training as soon as an evaluation reaches target_return."""

    # The system.
    architecture: Literal["sebulba", "anakin"] = "sebulba"
    """sebulba: actor processes step the envs and send trajectories to the learner; anakin: the
    learner plays the envs itself, acting and learning in one jitted function on its devices
    (on-policy agents, envs with a JAX port: jaxdist.envs.jax_envs; num_actors x envs_per_actor envs)."""
    num_seeds: int = 1
    """Independent runs trained at once in one program, vmapped (architecture anakin): seed i's
    curves are logged as seed/<i>/..., the summary reports each."""
    learner_hosts: int = 1
    """Learner processes, one per host (launcher multihost), together one jax.distributed learner."""
    learner_mode: Literal["jit", "pmap"] = "jit"
    learner_prefetch: int = 0
    """Batches fetched ahead of the learner (0: fetched inline, the lowest policy lag)."""
    learner_steps_per_call: int = 1
    """Updates per learner dispatch (``lax.scan``), their batches sampled in one replay request."""
    publish_every_updates: int = 1
    param_refresh_seconds: float = 0.02
    """How often actors ask for newer parameters."""
    max_in_flight: int = 1
    """Trajectory sends an actor may have pending."""
    max_send_wait: float = 5.0
    """Seconds an actor waits for a send slot before dropping a trajectory."""
    checkpoint_every_updates: int = 200
    replay_checkpoint_seconds: float | None = None
    """Save the replay's contents this often and at a stop (None: not saved)."""
    log_every_updates: int = 5

    def __post_init__(self) -> None:
        if self.num_seeds > 1 and self.architecture != "anakin":
            raise ValueError(f"num_seeds={self.num_seeds} trains seeds vmapped inside one learner: it needs "
                             f"--architecture anakin (or launch one run per seed)")
        check_bounds(self, {
            **dict.fromkeys(("num_seeds", "num_actors", "envs_per_actor", "trajectory_length", "total_steps",
                             "eval_every_updates", "eval_episodes", "learner_hosts", "learner_steps_per_call",
                             "publish_every_updates", "max_in_flight", "checkpoint_every_updates",
                             "log_every_updates", "hidden"), AT_LEAST_ONE),
            **dict.fromkeys(("learner_prefetch", "param_refresh_seconds", "max_send_wait"), NON_NEGATIVE),
            "seed": SEED, "replay_checkpoint_seconds": POSITIVE})
        check_network_name(self.network)
        missing = backend_unavailable(self.env_backend)
        if missing:
            raise ValueError(missing)
        if self.env_backend == "jax" or self.architecture == "anakin":
            missing = jax_version_missing(self.env_id.rpartition(":")[2])
            if missing:
                flag = "--env-backend jax" if self.env_backend == "jax" else "--architecture anakin"
                raise ValueError(f"{flag} plays the env's JAX version, and there is {missing}: drop {flag} to "
                                 f"play gymnasium's env")
        if self.num_actors % self.learner_hosts:
            raise ValueError(f"learner_hosts ({self.learner_hosts}) must divide num_actors ({self.num_actors}): "
                             f"each host's learner learns from its own actors' share; pass e.g. "
                             f"--num-actors {self.learner_hosts}")
        if self.batch_size % self.learner_hosts:
            raise ValueError(f"learner_hosts ({self.learner_hosts}) must divide the batch ({self.batch_size})")
        if self.stop_at_target and self.target_return is None:
            raise ValueError(f"stop_at_target needs a target_return: {self.env_id} has no preset one")

    @property
    def batch_size(self) -> int:
        """Items (trajectories or transitions) one update samples, over all learner hosts."""
        raise NotImplementedError

    @property
    def steps_per_update(self) -> float:
        """Env steps behind one update, for counting a resumed run's env steps."""
        raise NotImplementedError

    @property
    def total_updates(self) -> int:
        return max(1, round(self.total_steps / self.steps_per_update))


Presets = Mapping[str | tuple[str, str], Mapping[str, Any]]
"""Per-env tuned defaults of an agent: env id -> {field: value} (rl-baselines3-zoo's idea), and
(env id, env backend) -> what differs when the actors play that backend."""


def with_preset(config_type: Callable[..., AgentConfig], env_id: str, presets: Presets,
                **fields: Any) -> AgentConfig:
    """The config for ``env_id``: the class defaults, then the env's preset, then its backend's
    (the backend ``fields`` or the env's preset name), then ``fields``."""
    preset = presets.get(env_id, {})
    backend = fields.get("env_backend", preset.get("env_backend"))
    return config_type(**{**preset, **presets.get((env_id, backend), {}), "env_id": env_id, **fields})


def to_dict(config: AgentConfig) -> dict[str, Any]:
    return {field.name: _jsonable(getattr(config, field.name)) for field in dataclasses.fields(config)}


def _jsonable(value: Any) -> Any:
    """Tuples as lists; a network given as a Python callable by its ``module:name``, the form
    ``--network`` takes (``load_policy`` imports it again)."""
    if callable(value):
        return f"{value.__module__}:{value.__qualname__}"
    return list(value) if isinstance(value, tuple) else value


def from_dict(config_type: Callable[..., AgentConfig], values: Mapping[str, Any]) -> AgentConfig:
    """A config from its saved form; tuples come back as tuples, unknown fields are an error."""
    known = {field.name: field for field in dataclasses.fields(config_type)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"{config_type.__name__} has no field(s) {', '.join(unknown)}: the run was saved by "
                         f"another version of jaxdist")
    return config_type(**{name: tuple(value) if isinstance(value, list) else value for name, value in values.items()})


def save(run_dir: str, agent: str, config: AgentConfig) -> None:
    """``<run_dir>/config.json``: the agent's name and its resolved config. Written whole, through
    a file of this process's own: every host of a multihost run saves it into one shared
    directory, and with one temporary name a host's replace could take another's file away."""
    os.makedirs(run_dir, mode=0o700, exist_ok=True)  # as launchers make run directories: the owner's alone
    path = os.path.join(run_dir, CONFIG_FILE)
    staged = f"{path}.{os.getpid()}.tmp"
    with open(staged, "w") as f:
        json.dump({"agent": agent, "config": to_dict(config)}, f, indent=2)
    os.replace(staged, path)


def load(run_dir: str) -> tuple[str, dict[str, Any]]:
    """(agent name, config fields) saved in ``run_dir``."""
    path = os.path.join(run_dir, CONFIG_FILE)
    try:
        with open(path) as f:
            saved = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"{run_dir} has no {CONFIG_FILE}: is it the run directory of a jaxdist agent "
                                f"(runs/<agent>-<env>-seed<seed>)?") from None
    return saved["agent"], saved["config"]


def differences(saved: Mapping[str, Any], config: AgentConfig) -> dict[str, tuple[Any, Any]]:
    """Fields whose value differs between a saved config and ``config``: {name: (saved, now)}."""
    now = to_dict(config)
    names = sorted(set(saved) | set(now))
    return {name: (saved.get(name), now.get(name)) for name in names if saved.get(name) != now.get(name)}
