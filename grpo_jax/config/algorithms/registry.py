"""The registry of algorithms as the config sees them: what each `--algorithm` adds to the objective section.

    register(AlgorithmSpec(name="ppo", order=1, help="ppo (...)", section=PPOConfig, what="token-level PPO",
                           check=..., check_run=..., without_group_advantages="...", ...))
    specs()          # every registered AlgorithmSpec, in `order`
    spec("ppo")      # one by name

From the registry come `--algorithm`'s choices and help (config.ALGORITHMS), each algorithm's own section as
the ObjectiveConfig field named after it, the sub-settings rule of that section (the mechanism "NAME"), the
mechanisms of the objective that only some algorithms use (group advantages, the loss's KL term, the
clipped-ratio policy term: each spec says why it goes without one), and the algorithm's own checks. The update
code of each name is grpo_jax.algorithms.ALGORITHMS (which imports the config, so the config cannot import
it: tests/test_config_registries.py checks the two lists are equal).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from grpo_jax.config.base import Mechanism


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
    """One `--algorithm`. Reasons ("why it goes without ...") are "" where the algorithm has the thing."""

    name: str  # the --algorithm value
    order: (
        int  # its place in --algorithm's choices and help, and its section's among ObjectiveConfig's fields
    )
    help: str  # its part of --algorithm's help: "name (what it is; its --name_* flags)"
    # its own knobs: a frozen config dataclass (FLAG_PREFIX "name_"), the ObjectiveConfig field `name`; its
    # fields are refused while another algorithm runs ("only used with --algorithm=name ({what})")
    section: type | None = None
    what: str = ""
    kl_fields: tuple[str, ...] = ()  # fields of `section` that only matter with a KL penalty
    # what it refuses in the objective (called by ObjectiveConfig.__post_init__ when it is the algorithm)
    check: Callable[[Any], None] | None = None
    # what it refuses across sections (called by RunConfig.__post_init__ when it is the algorithm)
    check_run: Callable[[Any], None] | None = None
    without_group_advantages: str = ""  # why --adv_ddof / --adv_eps do not apply
    without_loss_kl: str = ""  # why the loss has no KL term (--kl_estimator, --kl_bias_correction)
    without_ratio_policy_term: str = ""  # why --eps_low / --eps_high / --dual_clip / --delta do not apply
    without_multi_turn: str = ""  # why it cannot train on --max_turns > 1 trajectories
    # its ratio is to the sampler already: off-policy rollouts (replay, async rewards) need no --tis_cap
    ratio_to_sampler: bool = False

    def mechanism(self) -> Mechanism | None:
        """The sub-settings rule of its section (scope "objective"), or None without one."""
        if self.section is None:
            return None
        return Mechanism(
            self.name,
            "objective",
            f"--algorithm={self.name}",
            self.what,
            lambda o: o.algorithm == self.name,
            lambda o: f"--algorithm={o.algorithm}",
            tuple(f"{self.name}.{f.name}" for f in dataclasses.fields(self.section)),
        )


_SPECS: dict[str, AlgorithmSpec] = {}


def register(spec: AlgorithmSpec) -> AlgorithmSpec:
    if spec.name in _SPECS:
        raise ValueError(f"algorithm {spec.name!r} is registered twice")
    if spec.section is not None and getattr(spec.section, "FLAG_PREFIX", None) != f"{spec.name}_":
        raise ValueError(f"algorithm {spec.name!r}: its section's FLAG_PREFIX must be {spec.name + '_'!r}")
    _SPECS[spec.name] = spec
    return spec


def specs() -> tuple[AlgorithmSpec, ...]:
    """Every registered algorithm, in `order`."""
    return tuple(sorted(_SPECS.values(), key=lambda s: (s.order, s.name)))


def spec(name: str) -> AlgorithmSpec:
    return _SPECS[name]
