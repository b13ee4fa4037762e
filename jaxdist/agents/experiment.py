"""An experiment: an agent's config, its record, and the topology its program is built on.

**Config.** An agent's config is one frozen dataclass that extends :class:`AgentConfig` with its
algorithm's fields. It is the whole experiment: the command line is generated from it
(:mod:`jaxdist.agents.run`), it is saved in the run directory with the agent's factory
(``module:function``), and ``load_policy`` rebuilds the agent from the two.

**Record.** :class:`Agent` names an algorithm's parts as ``module:function`` (learner logic,
policy, replay table, sink), imported where a node runs them.

**Topology.** Where the architecture is read: :data:`ARCHITECTURES` maps
``config.architecture`` to a :class:`Topology`, the one protocol the runner, the monitor and
``load_policy`` see (an agent with a program of its own, ES, implements it too; so does a PBT
population of Sebulba runs, :mod:`jaxdist.agents.population`):

- :class:`Sebulba` (Acme's ``make_distributed_experiment``): per learner host h, a process
  ``learner/h`` of threads: the agent's replay table (a FIFO for on-policy agents, prioritized
  for Ape-X), the Learner (host 0's serves the parameters: ``get``) and, on host 0, the
  Evaluator, which plays the deterministic policy every ``eval_every_updates`` and whose mean
  return is the reported and target metric (a process of its own, ``evaluator/0``, when the
  learner spans hosts: there every Orbax save in a learner process is collective). Actors
  ``actor/i`` feed the replay of host ``i % learner_hosts``; one factory makes them all, so
  the group grows and shrinks as it runs (``running.scale("actor", n)``).
- :class:`Anakin` (:mod:`jaxdist.learning.anakin`): a learner process per learner host that
  plays its own envs, written in JAX, inside its update, and evaluates them there.

Training ends inside the program, so ``jd.launch(agent.topology().program).wait()`` returns:
the evaluator calls ``jd.stop()`` once it has evaluated the learner's last version (or the
learner, told at the target with ``stop_at_target``, finishes), and under Anakin the learner
itself. The env steps of a run are counted by the nodes that make them (``acting``: actors, or
the Anakin learner) and summed by the monitor. Building a program has no side effects and is
deterministic (every host of a multihost run builds the same one) and imports no JAX: a node's
process imports what its node needs.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import importlib
import importlib.machinery
import json
import math
import os
import re
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol

import jaxdist as jd
from jaxdist.agents import sweep
from jaxdist.envs import atari
from jaxdist.envs.ports import envpool_installed, jax_version_missing
from jaxdist.envs.spaces import EnvInfo, env_info
from jaxdist.envs.vector import EnvSpec, backend_unavailable

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


def check_choices(config: Any) -> None:
    """Refuse a value outside the choices of a ``Literal`` field, by name: the command line only
    warns of one that came in as a default (an ``--env-id`` preset's, or a flag read before
    parsing), and a node would fail on it after the launch."""
    for name, hint in typing.get_type_hints(type(config)).items():
        value = getattr(config, name, None)
        if typing.get_origin(hint) is Literal and value not in typing.get_args(hint):
            raise ValueError(f"{name} must be one of {', '.join(map(repr, typing.get_args(hint)))}, got {value!r}")


CNN_MIN_SIZE = 36  # the Nature-DQN torso's VALID convolutions take 36 -> 8 -> 3 -> 1 pixels; smaller: MinAtar's
_FACTORY = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


def check_network_name(network: Any) -> None:
    """``network`` is ``mlp``, ``cnn`` or ``package.module:function`` (from Python, also a
    callable); whether the function exists is known only where it is imported."""
    if isinstance(network, str) and network not in ("mlp", "cnn") and not _FACTORY.fullmatch(network):
        raise ValueError(f"network must be 'mlp', 'cnn' or 'package.module:function'; got {network!r}")


def check_core(config: Any) -> None:
    """Refuse a core an agent cannot carry, or a name that is no core, before anything starts."""
    if config.core == "none":
        return
    if not type(config).recurrent_cores:
        raise ValueError(f"{type(config).__name__} takes no recurrent core (--core {config.core}): its networks are "
                         f"feed-forward; use --core none, or an agent with memory (PPO, IMPALA, R2D2)")
    if config.core not in ("lstm", "gru") and not _FACTORY.fullmatch(config.core):
        raise ValueError(f"core must be 'none', 'lstm', 'gru' or 'package.module:function'; got {config.core!r}")


def import_factory(spec: str, what: str = "network") -> Callable[[], Any]:
    """The function ``spec`` (``package.module:function``) names, imported: a torso's or a
    core's factory (``what`` says which, in the errors), called wherever the network is built."""
    if what == "network":
        check_network_name(spec)
    module_name, _, name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is None or not (module_name == err.name or module_name.startswith(f"{err.name}.")):
            raise
        raise ValueError(f"{what} {spec!r}: cannot import module {module_name!r} ({err}); it must "
                         "be importable (installed or on PYTHONPATH) wherever the network is "
                         "built") from err
    factory = getattr(module, name, None)
    if not callable(factory):
        raise ValueError(f"{what} {spec!r}: module {module_name!r} has no function {name!r}")
    return factory


def check_network_input(network: Any, env_id: str, obs_shape: tuple[int, ...]) -> None:
    """Refuse a built-in torso for observations it cannot take, before a learner fails on them."""
    if network == "cnn" and len(obs_shape) != 3:
        raise ValueError(f"network 'cnn' takes images (height, width, channels); {env_id}'s observations are "
                         f"{obs_shape}: use --network mlp or a torso of your own")
    if network == "mlp" and len(obs_shape) != 1:
        raise ValueError(f"network 'mlp' takes flat observations; {env_id}'s are {obs_shape}: use --network cnn for "
                         f"images or a torso of your own")


def check_sticky_actions(env_id: str, probability: float) -> None:
    """Refuse sticky actions for an env that has none: only EnvPool's Atari games take them."""
    if probability and not atari.is_atari(env_id):
        missing = "" if envpool_installed() else " (EnvPool, which has them, is not installed: pip install envpool)"
        raise ValueError(f"repeat_action_probability makes EnvPool's Atari games' actions sticky; {env_id} is not "
                         f"one of them{missing}: drop --repeat-action-probability")


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
    repeat_action_probability: float = 0.0
    """Sticky actions of EnvPool's Atari games, for actors and evaluator alike: at every frame the
    emulator repeats the previous action instead of the agent's with this probability (0.25 in
    Machado et al. 2018's protocol; 0, EnvPool's default, in DQN's, Ape-X's, IMPALA's and Cleanba's)."""

    # Network.
    network: str = "mlp"
    """``mlp`` (widths in --hidden), ``cnn`` (the Nature-DQN torso, for image observations) or
    ``package.module:function`` returning a flax module (observations -> features)."""
    hidden: tuple[int, ...] = (64, 64)
    core: str = "none"
    """A recurrent core between the torso and the heads, for agents with memory (PPO, IMPALA,
    R2D2): ``lstm``, ``gru``, ``none`` or ``package.module:function`` returning a flax
    RNNCellBase (jaxdist.agents.recurrent)."""
    core_size: int = 128
    """Units of the recurrent core."""

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
    inference: Literal["actor", "central"] = "actor"
    """Where the actors' policy runs: actor, in each actor; central, in one inference node on the
    learner's host that answers every actor's observations with one batched policy call (SEED RL),
    a round trip per step for the actors, which then only step envs (sebulba, gymnasium backends)."""
    checkpoint_every_updates: int = 200
    replay_checkpoint_seconds: float | None = None
    """Save the replay's contents this often and at a stop (None: not saved)."""
    log_every_updates: int = 5

    # Many configurations in one run (jaxdist.agents.sweep).
    sweep: tuple[str, ...] = ()
    """FIELD=V1,V2,... (repeatable: a grid) or FIELD=LOW:HIGH[:log] (drawn by --sweep-random or --pbt) over the
    agent's float hyperparameters: anakin trains every configuration x num_seeds in one learner, sebulba one
    configuration after another (<run-dir>/config-<c>)."""
    sweep_random: int = 0
    """Draw this many configurations from the --sweep ranges instead of the grid."""
    pbt: int = 0
    """Population-based training of this many members drawn from the --sweep ranges (0: none): anakin trains them in
    one learner, sebulba each as a learner with its own actors and evaluator (<run-dir>/config-<m>)."""
    pbt_interval: int = 20
    """Updates between PBT's exploit-and-explore steps (each after an evaluation of every member)."""
    pbt_exploit: Literal["truncation", "none"] = "truncation"
    """truncation: the bottom pbt_fraction copy a member of the top pbt_fraction; none: no exploitation (a baseline)."""
    pbt_fraction: float = 0.25
    pbt_explore: Literal["perturb", "resample"] = "perturb"
    """perturb: multiply each copied field by 0.8 or 1.2 (kept in its --sweep range); resample: draw it anew."""
    recurrent_cores: typing.ClassVar[bool] = False
    """Whether the agent's networks take a recurrent ``core`` (its config class says)."""

    def __post_init__(self) -> None:
        check_choices(self)
        if self.num_seeds > 1 and self.architecture != "anakin":
            raise ValueError(f"num_seeds={self.num_seeds} trains seeds vmapped inside one learner: it needs "
                             f"--architecture anakin (or launch one run per seed)")
        check_bounds(self, {
            **dict.fromkeys(("num_seeds", "num_actors", "envs_per_actor", "trajectory_length", "total_steps",
                             "eval_every_updates", "eval_episodes", "learner_hosts", "learner_steps_per_call",
                             "publish_every_updates", "max_in_flight", "checkpoint_every_updates",
                             "log_every_updates", "hidden", "pbt_interval",
                             "core_size"), AT_LEAST_ONE),
            **dict.fromkeys(("sweep_random", "pbt"), NON_NEGATIVE), "pbt_fraction": Bound(0, 0.5, low_open=True),
            **dict.fromkeys(("learner_prefetch", "param_refresh_seconds", "max_send_wait"), NON_NEGATIVE),
            "seed": SEED, "replay_checkpoint_seconds": POSITIVE, "repeat_action_probability": UNIT_INTERVAL})
        check_network_name(self.network)
        check_core(self)
        check_sticky_actions(self.env_id, self.repeat_action_probability)
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
        if self.inference == "central" and (self.architecture != "sebulba" or self.env_backend == "jax"):
            raise ValueError("--inference central answers actors that step gymnasium's envs; under --architecture "
                             "anakin or --env-backend jax the policy plays inside the envs' jitted scan: drop "
                             "--inference central")
        if self.inference == "central" and self.core != "none":
            raise ValueError(f"--inference central keeps no recurrent state per actor's env; --core {self.core} "
                             f"needs --inference actor")
        if self.stop_at_target and self.target_return is None:
            raise ValueError(f"stop_at_target needs a target_return: {self.env_id} has no preset one")
        sweep.check(self)

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


def save(run_dir: str, factory: str, config: Any) -> None:
    """``<run_dir>/config.json``: the agent's factory (``module:function``), its config's class
    and the resolved config. Written whole, through a file of this process's own: every host of
    a multihost run saves it into one shared directory, and with one temporary name a host's
    replace could take another's file away."""
    os.makedirs(run_dir, mode=0o700, exist_ok=True)  # as launchers make run directories: the owner's alone
    path = os.path.join(run_dir, CONFIG_FILE)
    staged = f"{path}.{os.getpid()}.tmp"
    with open(staged, "w") as f:
        json.dump({"agent": factory, "config_type": qualified_name(type(config)), "config": to_dict(config)}, f,
                  indent=2)
    os.replace(staged, path)


RELEASED_AGENTS = {name: (f"jaxdist.agents.{name}:agent", f"jaxdist.agents.{name}:{config}")
                   for name, config in (("ppo", "PPOConfig"), ("impala", "IMPALAConfig"), ("apex", "ApexConfig"),
                                        ("es", "ESConfig"))}
"""The short names the first release saved as ``agent`` in ``config.json``: their runs still load."""


@dataclasses.dataclass(frozen=True)
class Saved:
    """A run directory's ``config.json``: the agent's factory, its config class, the fields."""

    factory: str
    config_type: str
    fields: dict[str, Any]

    def agent(self) -> Any:
        """The agent record the run was trained by, rebuilt from the saved config."""
        config = from_dict(Lazy(self.config_type).resolve(), self.fields)
        return Lazy(self.factory)(config)

    def modules(self) -> list[str]:
        """The modules rebuilding the agent imports by name: its factory's, its config's, and
        those of a ``module:function`` network or a ``module:EnvId`` env."""
        named = [self.factory, self.config_type, self.fields.get("network"), self.fields.get("env_id")]
        return [name.partition(":")[0] for name in named if isinstance(name, str) and ":" in name]


def refuse_code_in(run_dir: str, saved: Saved) -> None:
    """Refuse a ``config.json`` that names a module whose code lies inside the run directory: a
    run directory is data from whoever made it (handed over, downloaded), and under the working
    directory, or as it, its files are importable. Found without importing anything."""
    inside = os.path.realpath(run_dir)
    for module in saved.modules():
        spec = importlib.machinery.PathFinder.find_spec(module.split(".")[0])
        where = [] if spec is None else [spec.origin, *(spec.submodule_search_locations or [])]
        for path in filter(None, where):
            if os.path.commonpath([inside, os.path.realpath(path)]) == inside:
                raise PermissionError(
                    f"{os.path.join(run_dir, CONFIG_FILE)} names module {module!r}, whose code is in the run directory "
                    f"itself ({path}): loading the run would run it. Install the module, or put it on PYTHONPATH "
                    f"outside the run directory; or, if you trust whoever made the run, pass trust_run_dir=True "
                    f"(--trust-run-dir)")


def load(run_dir: str) -> Saved:
    path = os.path.join(run_dir, CONFIG_FILE)
    try:
        with open(path) as f:
            saved = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"{run_dir} has no {CONFIG_FILE}: is it the run directory of a jaxdist agent "
                                f"(runs/<agent>-<env>-seed<seed>)?") from None
    factory, config_type = RELEASED_AGENTS.get(saved["agent"], (saved["agent"], saved.get("config_type")))
    if config_type is None or not _FACTORY.fullmatch(factory):
        raise ValueError(f"{path} names agent {saved['agent']!r}, which is neither a 'module:function' factory nor "
                         f"one of {', '.join(RELEASED_AGENTS)}: was it written by jaxdist?")
    return Saved(factory, config_type, saved["config"])


def differences(saved: Mapping[str, Any], config: Any) -> dict[str, tuple[Any, Any]]:
    """Fields whose value differs between a saved config and ``config``: {name: (saved, now)}."""
    now = to_dict(config)
    names = sorted(set(saved) | set(now))
    return {name: (saved.get(name), now.get(name)) for name in names if saved.get(name) != now.get(name)}


def qualified_name(value: Any) -> str:
    """``module:name`` of a module-level function or class: how a part is named and saved."""
    return f"{value.__module__}:{value.__qualname__}"


@dataclasses.dataclass(frozen=True)
class Lazy:
    """The function or class ``target`` (``"module:name"``), imported at its first use: an
    agent's parts live in modules that import JAX, which the launching process never needs."""

    target: str

    def resolve(self) -> Any:
        module, _, name = self.target.partition(":")
        return getattr(importlib.import_module(module), name)

    def __call__(self, *args: Any) -> Any:
        return self.resolve()(*args)


# The agent record --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Agent:
    """An algorithm as parts over one config, each named ``module:function`` and imported where
    a node calls it (so launching processes and actors stay free of what they do not run):

    - ``learner_logic(config, env) -> LearnerLogic``: the pure ``(init, update, params)``;
    - ``policy(config, env, actor) -> policy``: what actor ``actor`` runs, or with ``actor``
      None the deterministic policy of evaluation and ``load_policy``; a policy is
      ``(params, obs, key) -> (action, extras)`` (see ``jaxdist.nodes.actor``);
    - ``replay_table(config) -> table``: one learner host's table (default: a FIFO of
      trajectories, the on-policy agents');
    - ``sink(config, replay_client) -> sink``: what actors send through (None: trajectories go
      to the replay as they are);
    - ``prioritized``: the learner samples keys and probabilities and writes new priorities
      (its update's ``metrics["priorities"]``) back after every update.

    ``factory`` is the ``module:function`` that made this record from the config (saved in
    ``config.json``); ``name`` names the run (``runs/<name>-<env>-seed<seed>``).
    """

    name: str
    factory: str
    config: AgentConfig
    learner_logic: str
    policy: str
    replay_table: str = "jaxdist.agents.experiment:fifo"
    sink: str | None = None
    prioritized: bool = False

    @functools.cached_property
    def env(self) -> EnvInfo:
        return env_info(self.config.env_id)

    def __post_init__(self) -> None:
        check_network_input(self.config.network, self.config.env_id, self.env.obs_shape)

    def part(self, name: str, *args: Any) -> Any:
        """Call the part ``name`` (``"policy"``, ...) with ``args``."""
        return Lazy(getattr(self, name))(*args)

    def topology(self) -> Topology:
        """The program of this agent on its config's architecture, and what is known around it."""
        return ARCHITECTURES[self.config.architecture](self)


def fifo(config: AgentConfig) -> Any:
    """An on-policy agent's ``replay_table``: one learner host's FIFO of trajectories, its share
    of ``queue_size``; a full one makes actors wait (bounding the policy lag)."""
    return jd.replay.Fifo(max_size=config.queue_size // config.learner_hosts)


def fifo_size(config: AgentConfig, queue_trajectories: int | None, default: int) -> int:
    """An on-policy agent's ``queue_size``: ``queue_trajectories``, else the agent's ``default``
    raised until each learner host's share takes an actor's send (its envs' trajectories, one
    insert)."""
    return queue_trajectories or max(default, config.envs_per_actor * config.learner_hosts)


def check_fifo(config: AgentConfig, size: int, batch: int) -> None:
    """Refuses a FIFO that could never hold a batch, or take an actor's send: every send would
    be refused and the run would act without ever learning."""
    if size < batch:
        raise ValueError(f"queue_trajectories ({size}) must hold one batch ({batch})")
    share = size // config.learner_hosts
    if config.architecture == "sebulba" and share < config.envs_per_actor:
        raise ValueError(f"queue_trajectories ({size}) holds {share} trajectories per learner host, fewer than an "
                         f"actor sends at once (one per env, --envs-per-actor {config.envs_per_actor}): raise "
                         f"--queue-trajectories to at least {config.envs_per_actor * config.learner_hosts}, or "
                         f"lower --envs-per-actor")


# The topologies ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Policy:
    """A trained policy as a topology restores it: the parameters, the learner version they are
    of, the policies that act with them (by ``deterministic``) and the observations' shape."""

    params: Any
    version: int
    policies: dict[bool, Any]
    obs_shape: tuple[int, ...]


class Topology(Protocol):
    """What a run is, for everything outside its program: the program and where its groups go
    (the multihost and Ray launchers' ``placement``); ``learner``, which serves ``status()``
    (``step``, ``restored_step``); ``acting``, the nodes that make env steps, each serving
    ``stats()`` (``env_steps`` of its life, ``version``) and optionally ``episodes(since)``
    (training returns); ``last_update``, the learner's, where known before training; ``seeds``
    trained at once; where checkpoints and the best policy live, and the trained policy."""

    program: jd.Program
    learner: jd.Handle
    acting: list[jd.Handle]
    placement: dict[str, Any]
    last_update: int | None
    seeds: int

    def checkpoints(self, run_dir: str) -> str:
        """The learner's checkpoint directory."""

    def keeps_best(self, run_dir: str) -> bool:
        """Whether ``load_policy(run_dir, best=True)`` has a policy to play."""

    def trained(self, run_dir: str, step: int | None, run_seed: int, best: bool) -> Policy:
        """The policy of checkpoint ``step`` (default the latest), or of the best evaluation."""


LEARNER_RESTART = jd.Restart(max_restarts=10, backoff=1.0)
ACTOR_RESTART = jd.Restart(max_restarts=10, backoff=0.5)


@dataclasses.dataclass
class Sebulba:
    """Actors, a replay per learner host, learners and an evaluator: see the module docstring."""

    agent: Agent

    def __post_init__(self) -> None:
        agent, config = self.agent, self.agent.config
        self.program = jd.Program(program_name(agent))
        hosts = config.learner_hosts
        replays, learners = [], []
        for host in range(hosts):
            replay_node = learner_replay(agent)
            replays.append(replay_node.create_handle())
            learner_node = jd.CourierNode(sebulba_learner, agent, replays[-1]).with_options(
                stops_first=True, restart=LEARNER_RESTART)
            parts = [replay_node, learner_node]
            learners.append(learner_node.create_handle())
            if hosts == 1:
                parts.append(jd.CourierNode(evaluator, agent, learners[0]))
            self.program.add_node(jd.ColocationNode(parts, mode="threads"), label="learner")
        self.learner = learners[0]
        # A learner process (with its replay) on each of the first learner_hosts hosts, actors
        # round-robin over the hosts (actor i beside the replay it feeds when every host has a learner).
        self.placement = {"learner": jd.per_host() if hosts > 1 else jd.on_host(0), "actor": jd.spread()}
        policy_source = learners[0]
        if config.inference == "central":
            server = jd.CourierNode(inference_server, agent, learners[0]).with_options(restart=ACTOR_RESTART)
            policy_source = self.program.add_node(server, label="inference")
            self.placement["inference"] = jd.on_host(0)
        self.acting = self.program.add_group("actor", functools.partial(actor_node, agent, policy_source, replays),
                                             config.num_actors)
        if hosts > 1:
            self.program.add_node(jd.CourierNode(evaluator, agent, learners[0]), label="evaluator")
            self.placement["evaluator"] = jd.on_host(0)
        self.last_update, self.seeds = config.total_updates, 1

    def checkpoints(self, run_dir: str) -> str:
        return learner_checkpoints(run_dir, self.learner)

    def keeps_best(self, run_dir: str) -> bool:
        from jaxdist.learning.layout import checkpoint_dir
        from jaxdist.nodes.evaluator import BEST_POLICY

        return os.path.isdir(checkpoint_dir(run_dir, BEST_POLICY))

    def trained(self, run_dir: str, step: int | None, run_seed: int, best: bool) -> Policy:
        """The learner's published parameters, or those the evaluator saved at the run's best evaluation."""
        agent = self.agent
        if best:
            return best_policy(agent, run_dir)
        logic = agent.part("learner_logic", agent.config, agent.env)
        restored = restore_learner(run_dir, self.checkpoints(run_dir), learner_template(logic), step,
                                   saves_every(agent.config))
        return Policy(logic.params(restored["state"]), int(restored["step"]), actor_policies(agent),
                      agent.env.obs_shape)


def learner_replay(agent: Agent) -> jd.ReplayNode:
    """The replay node beside a learner: the agent's table, checkpointed as the config says."""
    config = agent.config
    return jd.ReplayNode(agent.part("replay_table", config), checkpoint=config.replay_checkpoint_seconds is not None,
                         checkpoint_every_seconds=config.replay_checkpoint_seconds)


def best_policy(agent: Agent, run_dir: str) -> Policy:
    """The parameters the evaluator node of the run in ``run_dir`` saved at its best evaluation."""
    from jaxdist.learning.checkpoint import restore_saved
    from jaxdist.learning.layout import checkpoint_dir
    from jaxdist.nodes.evaluator import BEST_POLICY

    no_best = FileNotFoundError(f"{run_dir} has no best policy: the evaluator node saves one at each better "
                                f"evaluation; load the latest checkpoint's instead (best=False)")
    version, params = restore_saved(checkpoint_dir(run_dir, BEST_POLICY), published_shapes(agent), None, no_best)
    return Policy(params, version, actor_policies(agent), agent.env.obs_shape)


@dataclasses.dataclass
class Anakin:
    """A learner process per learner host that plays and evaluates its own envs
    (:mod:`jaxdist.learning.anakin`); no actors, no replay, no evaluator node. Its learner makes
    the env steps and counts them."""

    agent: Agent

    def __post_init__(self) -> None:
        agent, config = self.agent, self.agent.config
        if agent.sink is not None or agent.prioritized:
            raise ValueError(f"architecture='anakin' runs on-policy agents (a batch of trajectories per update); "
                             f"{agent.name} learns from replayed transitions: use architecture='sebulba'")
        self.program = jd.Program(program_name(agent))
        with self.program.group("learner"):
            learners = [self.program.add_node(jd.CourierNode(anakin_learner, agent).with_options(
                stops_first=True, restart=LEARNER_RESTART)) for _ in range(config.learner_hosts)]
        self.learner, self.acting = learners[0], learners[:1]
        self.placement = {"learner": jd.per_host() if config.learner_hosts > 1 else jd.on_host(0)}
        configurations, seeds = sweep.layout(config)
        self.last_update, self.seeds = config.total_updates, configurations * seeds

    def checkpoints(self, run_dir: str) -> str:
        return learner_checkpoints(run_dir, self.learner)

    def keeps_best(self, run_dir: str) -> bool:
        return True  # in the learner's checkpoints, for each seed

    def trained(self, run_dir: str, step: int | None, run_seed: int, best: bool) -> Policy:
        """Seed ``run_seed``'s published parameters, or its best evaluated ones, which the
        learner's state keeps."""
        import jax

        restored = restore_learner(run_dir, self.checkpoints(run_dir), learner_template(anakin_logic(self.agent)),
                                   step, saves_every(self.agent.config))
        state, version = restored["state"], int(restored["step"])
        params = jax.vmap(self.agent.part("learner_logic", self.agent.config, self.agent.env).params)(state["agent"])
        if best:
            params, version = state["best"]["params"], int(state["best"]["version"][run_seed])
            if version < 0:
                raise FileNotFoundError(f"{run_dir} has no best policy yet: seed {run_seed} of this Anakin run was "
                                        f"not evaluated before its latest checkpoint; load that checkpoint's "
                                        f"(best=False)")
        params = jax.tree.map(lambda leaf: leaf[run_seed], params)  # the seed axis
        return Policy(params, version, actor_policies(self.agent), self.agent.env.obs_shape)


def sebulba(agent: Agent) -> Topology:
    """Sebulba's program, or with ``--pbt`` a population of them (:mod:`jaxdist.agents.population`)."""
    return Lazy("jaxdist.agents.population:Population")(agent) if agent.config.pbt else Sebulba(agent)


ARCHITECTURES: dict[str, Callable[[Agent], Topology]] = {"sebulba": sebulba, "anakin": Anakin}
"""``config.architecture`` -> the topology it builds: the one place the architecture is read."""


def program_name(agent: Any) -> str:
    return f"{agent.name}-{env_slug(agent.config.env_id)}"


def learner_checkpoints(run_dir: str, learner: jd.Handle) -> str:
    """Where a learner saves: its node's directory, or, for a learner spanning hosts, its
    group's (shared by all its processes)."""
    from jaxdist.learning.layout import checkpoint_dir

    single = checkpoint_dir(run_dir, learner.node_name)
    return single if os.path.isdir(single) else checkpoint_dir(run_dir, learner.node_name.split("/")[0])


SINGLE_THREAD_XLA = "--xla_cpu_multi_thread_eigen=false"
"""Small XLA computations on a shared CPU: Eigen's operations on the calling thread, no pool
hand-offs. (XLA stops reading its flags at the first word without ``--``.)"""


def resources(program: jd.Program, compilation_cache: str | None = None) -> dict[str, dict[str, Any]]:
    """Per-group environment for the processes launcher: the learners on ``JAX_PLATFORMS`` (unset:
    JAX's own choice, a GPU or TPU where there is one), the inference node with them where the host
    has a GPU (taking its memory as it needs it: the learner preallocates), every other node on CPU
    (a TPU opens in one process only, and every process on a GPU would take most of its memory);
    single-threaded XLA (the caller's own ``XLA_FLAGS`` after it: theirs win), and optionally a
    persistent compilation cache shared by every process."""
    env = {"XLA_FLAGS": f"{SINGLE_THREAD_XLA} {os.environ.get('XLA_FLAGS', '')}".strip()}
    if compilation_cache:
        env.update(JAX_COMPILATION_CACHE_DIR=compilation_cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                   JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    learner_platforms = os.environ.get("JAX_PLATFORMS", "")
    platforms = {"learner": {"JAX_PLATFORMS": learner_platforms}}
    if gpu_present():
        platforms["inference"] = {"JAX_PLATFORMS": learner_platforms, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    return {group: {"env": {**env, **platforms.get(group, {"JAX_PLATFORMS": "cpu"})}} for group in program.groups}


def gpu_present() -> bool:
    """Whether this host has an NVIDIA or AMD GPU, read from its device files: a JAX started in
    the launching process to ask would hold most of the GPU's memory."""
    return bool(glob.glob("/dev/nvidia[0-9]*")) or os.path.exists("/dev/kfd")


def env_slug(env_id: str) -> str:
    """``CartPole-v1`` -> ``cartpole``; ``my_envs:Maze-v0`` -> ``maze``: for run and program names."""
    return env_id.rpartition(":")[2].lower().rsplit("-v", 1)[0]


def actor_seed(seed: int, index: int) -> int:
    """Distinct per actor and run; spaced so sync/async sub-envs (seed + i) never collide."""
    return seed * 1_000_003 + index * 10_007


def env_spec(config: AgentConfig, num_envs: int, evaluation: bool = False) -> EnvSpec:
    """The actors' envs, or the evaluator's (one episode per env): with the JAX backend it plays
    all its episodes in one jitted call, on the port that is checked against gymnasium's env. An
    Atari game is evaluated on whole games with the game's scores; actors and evaluator play it
    with the config's sticky actions (``jaxdist.envs.atari``)."""
    kwargs = dict(atari.EVALUATION) if evaluation and atari.is_atari(config.env_id) else {}
    if config.repeat_action_probability:
        kwargs["repeat_action_probability"] = config.repeat_action_probability
    return EnvSpec(config.env_id, num_envs, config.env_backend, kwargs)


def saves_every(config: AgentConfig) -> str:
    """How often the learner saves, for the error that finds no checkpoint yet."""
    return f"{config.checkpoint_every_updates} updates"


def learner_template(logic: Any) -> Any:
    """The shapes of a learner's checkpoint (``{"state", "step"}`` of ``logic``), for a restore."""
    import jax

    from jaxdist.nodes.learner import initial_state

    return jax.eval_shape(functools.partial(initial_state, logic), jax.random.key(0))


def restore_learner(run_dir: str, directory: str, template: Any, step: int | None, every: str) -> Any:
    """The checkpoint of ``step`` (default: the latest) that a learner, or a node standing for
    one, saved in ``directory`` every ``every`` ("10 updates"), shaped as ``template``."""
    from jaxdist.learning.checkpoint import restore_saved

    missing = FileNotFoundError(f"{run_dir} has no complete learner checkpoint yet: train longer (the learner "
                                f"saves every {every} and at a stop)")
    return restore_saved(directory, template, step, missing)[1]


def actor_policies(agent: Agent) -> dict[bool, Any]:
    """The deterministic policy (evaluation's) and actor 0's, by ``deterministic``."""
    return {deterministic: agent.part("policy", agent.config, agent.env, None if deterministic else 0)
            for deterministic in (True, False)}


# Node factories: each runs in its node's own process, where handles have become clients. ------


def _learner_parts(agent: Agent, config_dir: str | None = None) -> dict[str, Any]:
    """What every learner of ``agent`` is built with, whatever feeds it: the loop's settings, its
    checkpointing and its publishing. A learner spanning hosts joins their jax.distributed
    group here, before anything touches JAX's devices. It saves the run's config, however it was
    launched, in ``config_dir`` (default: the node's run directory)."""
    from jaxdist.nodes.learner import CheckpointOptions, PublishOptions, join_hosts

    config = agent.config
    save(config_dir or jd.current_node().run_dir, agent.factory, config)
    join_hosts(config.learner_hosts)
    return dict(steps_per_call=config.learner_steps_per_call, seed=config.seed, max_steps=config.total_updates,
                prefetch=config.learner_prefetch,
                checkpointing=CheckpointOptions(save_every_steps=config.checkpoint_every_updates, keep=2),
                publishing=PublishOptions(every=config.publish_every_updates, log_every=config.log_every_updates))


def sebulba_learner(agent: Agent, replay: Any, logic: Any = None, config_dir: str | None = None,
                    **options: Any) -> Any:
    """The learner of a replay fed by actors; the evaluator ends the program, after the final
    version. A prioritized agent's learner samples the keys and probabilities with the data and
    writes new priorities back behind it. ``logic`` and the ``Learner``'s ``options`` replace
    the agent's own, ``config_dir`` is where it saves the config (a run of a population's:
    :mod:`jaxdist.agents.population`)."""
    from jaxdist.nodes.learner import Learner, ReplaySource
    from jaxdist.nodes.replay import PriorityWriter

    config, parts = agent.config, {**_learner_parts(agent, config_dir), **options}
    multihost = config.learner_hosts > 1
    source = ReplaySource(replay, config.batch_size // config.learner_hosts,
                          field=None if agent.prioritized else "data", end_on_stop=not multihost)
    return Learner(logic or agent.part("learner_logic", config, agent.env), source, mode=config.learner_mode,
                   after_update=PriorityWriter(replay) if agent.prioritized else None,
                   # Updates dispatched ahead of their results only age on-policy data (its lag counts
                   # dispatched updates); across processes an update waits on the slowest host anyway.
                   block_every=1 if multihost or not agent.prioritized else None, **parts)


def anakin_learner(agent: Agent) -> Any:
    """The learner that plays its envs in its update, and ends the program after its last."""
    import jax

    from jaxdist.learning import anakin
    from jaxdist.learning.pbt import Lineage
    from jaxdist.nodes.evaluator import EvaluationRecorder
    from jaxdist.nodes.learner import Learner

    config, parts = agent.config, _learner_parts(agent)
    multihost = config.learner_hosts > 1
    # One host: every local device plays its own envs (a multihost learner says its mode).
    mode = config.learner_mode if multihost else "pmap" if jax.local_device_count() > 1 else "jit"
    recorder = EvaluationRecorder(jd.current_node().run_dir, config.target_return, config.stop_at_target)
    if config.pbt:
        recorder = Lineage(jd.current_node().run_dir, config.pbt_interval, recorder)
    return Learner(anakin_logic(agent), anakin.no_batch, mode=mode, after_update=recorder, end_program=True,
                   block_every=1 if multihost else None, **parts)


def anakin_logic(agent: Agent) -> Any:
    """The learner logic of an Anakin run of ``agent`` (what its learner and ``load_policy`` build)."""
    from jaxdist.learning import anakin

    config, env = agent.config, agent.env
    return anakin.logic(agent.part("learner_logic", config, env), agent.part("policy", config, env, 0),
                        agent.part("policy", config, env, None), config.env_id,
                        config.batch_size // config.learner_hosts, config.trajectory_length,
                        num_seeds=config.pbt or config.num_seeds, eval_every=config.eval_every_updates,
                        eval_episodes=config.eval_episodes, final_version=config.total_updates,
                        swept=swept(agent))


def swept(agent: Agent) -> Any:
    """What differs between an Anakin run's runs (``jaxdist.agents.sweep``), or None."""
    from jaxdist.learning import anakin

    config = agent.config
    if not sweep.searches(config):
        return None
    population = None
    if config.pbt:
        population = anakin.PBT(config.pbt_interval, config.pbt_fraction, config.pbt_explore, pbt_ranges(config),
                                exploit=config.pbt_exploit != "none")
    return anakin.Swept(sweep.runs(config), functools.partial(traced_logic, agent), population)


def traced_logic(agent: Agent, values: Mapping[str, Any]) -> Any:
    """``agent``'s learner logic with ``values`` (traced, in an update) in place of its swept fields."""
    return agent.part("learner_logic", sweep.traced(agent.config, values), agent.env)


def pbt_ranges(config: AgentConfig) -> dict[str, Any]:
    """Where PBT may take each swept field (``pbt.Range``): a ``--sweep`` range, or its listed values."""
    from jaxdist.learning import pbt

    return {spec.field: pbt.Range(spec.low, spec.high, spec.log) if spec.is_range
            else pbt.Range(min(spec.values), max(spec.values), values=spec.values) for spec in sweep.specs(config)}


def actor_node(agent: Agent, policy_source: jd.Handle, replays: list[jd.Handle], index: int) -> jd.CourierNode:
    """Actor ``index``, feeding the replay of learner host ``index % hosts``: the actor group's
    factory, for the actors at launch and for those ``running.scale("actor", n)`` adds."""
    return jd.CourierNode(actor, agent, index, policy_source, replays[index % len(replays)]).with_options(
        restart=ACTOR_RESTART)


def actor(agent: Agent, index: int, policy_source: Any, replay: Any) -> Any:
    """Actor ``index``, acting with its policy on the parameters of ``policy_source`` (the
    learner), or, under ``inference="central"``, through ``policy_source``, the inference node."""
    from jaxdist.nodes.actor import Actor

    config = agent.config
    central = config.inference == "central"
    sink = replay if agent.sink is None else agent.part("sink", config, replay)
    return Actor(None if central else agent.part("policy", config, agent.env, index),
                 env_spec(config, config.envs_per_actor), None if central else policy_source,
                 sink, trajectory_length=config.trajectory_length, seed=actor_seed(config.seed, index),
                 refresh_every_seconds=config.param_refresh_seconds, max_in_flight=config.max_in_flight,
                 max_send_wait=config.max_send_wait, inference=policy_source if central else None,
                 params_like=functools.partial(published_shapes, agent) if config.env_backend == "jax" else None)


def inference_server(agent: Agent, params: Any) -> Any:
    """The inference node of ``inference="central"``: actor 0's policy for every actor."""
    from jaxdist.nodes.inference import InferenceServer

    config = agent.config
    return InferenceServer(agent.part("policy", config, agent.env, 0), params, max_callers=config.num_actors,
                           seed=actor_seed(config.seed, config.num_actors + 2),
                           refresh_every_seconds=config.param_refresh_seconds)


def published_shapes(agent: Agent) -> Any:
    """The shapes and dtypes of what the learner publishes, from its logic, without running it."""
    import jax

    logic = agent.part("learner_logic", agent.config, agent.env)
    return jax.eval_shape(lambda key: logic.params(logic.init(key)), jax.random.key(0))


def evaluator(agent: Agent, params: Any, **options: Any) -> Any:
    """The evaluator of ``params`` (the learner); ``options`` go to the ``Evaluator`` (a PBT
    member's run directory)."""
    from jaxdist.nodes.evaluator import Evaluator

    config = agent.config
    return Evaluator(agent.part("policy", config, agent.env, None),
                     env_spec(config, config.eval_episodes, evaluation=True), params,
                     every_updates=config.eval_every_updates, seed=actor_seed(config.seed, config.num_actors + 1),
                     target_return=config.target_return, stop_at_target=config.stop_at_target,
                     final_version=config.total_updates,
                     # At the target one learner process finishes there, so that the policy it saves
                     # is evaluated; the processes of a learner spanning hosts stop together instead.
                     finish_learner=config.learner_hosts == 1, save_best=True, **options)
