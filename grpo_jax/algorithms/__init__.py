"""The RL algorithms over one update engine (grpo_jax.train.step): each is a module with `make(obj) ->
Algorithm` (grpo_jax.algorithms.base), registered here under its `--algorithm` name.

    grpo   group-relative advantages, no critic (the default)
    ppo    token-level PPO with a value-head critic, KL-shaped rewards and GAE
    dppo   GRPO's advantages with DPPO's trust region on token probabilities vs the sampler (prime-rl)

Their shared policy loss (clip / cispo / sapo / vespo policy terms, KL, entropy bonus, IS correction, masks,
aggregation) is `grpo_jax.algorithms.policy_loss`; the formulas are grpo_jax.core's.
"""

from __future__ import annotations

from collections.abc import Callable

from grpo_jax.algorithms import dppo, grpo, ppo
from grpo_jax.algorithms.base import Algorithm, Coefs, OldStats, PolicyOutputs, Rows
from grpo_jax.config import ObjectiveConfig

# --algorithm=NAME -> the factory of its Algorithm (the names are config.ALGORITHMS, the flag's choices)
ALGORITHMS: dict[str, Callable[[ObjectiveConfig], Algorithm]] = {
    "grpo": grpo.make,
    "ppo": ppo.make,
    "dppo": dppo.make,
}


def make_algorithm(obj: ObjectiveConfig) -> Algorithm:
    """The Algorithm of `obj.algorithm` (hyper-parameters closed over: static, as in optax)."""
    return ALGORITHMS[obj.algorithm](obj)


__all__ = ["ALGORITHMS", "Algorithm", "Coefs", "OldStats", "PolicyOutputs", "Rows", "make_algorithm"]
