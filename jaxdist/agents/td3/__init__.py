"""TD3 (Fujimoto et al. 2018) as an agent record: its config (``TD3Config``, ``PRESETS``) and its
parts. It shares SAC's off-policy config, replay and sink (``jaxdist.agents.sac``); its math
(the deterministic policy, target policy smoothing, delayed policy updates, each actor's
Gaussian exploration noise) is in ``learning.py``. Nothing here imports JAX."""

from __future__ import annotations

import dataclasses

from jaxdist.agents.experiment import AT_LEAST_ONE, NON_NEGATIVE, Agent, Presets, check_bounds
from jaxdist.agents.sac import PRESETS as SAC_PRESETS
from jaxdist.agents.sac import OffPolicyConfig, continuous_record


@dataclasses.dataclass(frozen=True)
class TD3Config(OffPolicyConfig):
    """TD3: twin critics (the smaller of their targets), target policy smoothing (the target
    action plus noise of std ``policy_noise`` clipped to ``noise_clip``, in ``[-1, 1]`` action
    units), the policy and both targets updated every ``policy_delay`` critic updates.

    **Exploration.** Actor i of N adds Gaussian noise of std ``exploration_noise *
    (exploration_noise_max / exploration_noise) ** (i / (N - 1))`` (geometric from the first to
    the second; ``exploration_noise_max`` None: every actor ``exploration_noise``), as Ape-X
    spreads its epsilons: some actors explore hard, others nearly follow the policy. The
    evaluator plays the policy without noise."""

    policy_noise: float = 0.2
    noise_clip: float = 0.5
    policy_delay: int = 2
    exploration_noise: float = 0.1
    exploration_noise_max: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_bounds(self, {**dict.fromkeys(("policy_noise", "noise_clip", "exploration_noise",
                                             "exploration_noise_max"), NON_NEGATIVE),
                            "policy_delay": AT_LEAST_ONE})
        if self.exploration_noise_max is not None and self.exploration_noise_max > 0 and self.exploration_noise == 0:
            raise ValueError("a geometric spread of exploration noise needs exploration_noise > 0")

    def actor_noise(self, actor: int) -> float:
        """Actor ``actor``'s exploration noise std (one added by ``running.scale`` takes actor
        ``actor % num_actors``'s)."""
        top = self.exploration_noise if self.exploration_noise_max is None else self.exploration_noise_max
        if self.num_actors == 1 or top == self.exploration_noise:
            return self.exploration_noise
        return self.exploration_noise * (top / self.exploration_noise) ** ((actor % self.num_actors)
                                                                            / (self.num_actors - 1))


PRESETS: Presets = SAC_PRESETS
"""SAC's: the same tuned defaults per env id; every field stays overridable flag by flag."""


def agent(config: TD3Config) -> Agent:
    """The record ``run.train`` takes; ``agent(config).topology()`` builds its program."""
    return continuous_record("td3", config, "jaxdist.agents.td3.learning")


__all__ = ["PRESETS", "TD3Config", "agent"]
